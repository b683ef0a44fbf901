"""How iteration time grows with rollout batch size, model size and the number of engines,
and how much memory each process of the run holds.

    python -m bench.scaling [--iterations 8]

Short flow runs (`python -m flows.train`, async mode, 4 new tokens per sample, no
checkpoints or evals inside the window), each in a fresh run folder; every figure is the
median over iterations 2..N-1 of the run's metrics rows (iterations 0 and 1 pay for
warm-up). The base run (8 prompts x 8 samples, every group kept, the built-in tiny model, 1 engine) is
shared by the three tables; PSS per process role is sampled during it.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

from bench.process_roles import print_roles, watch_flow
from infra.storage.metrics import METRICS_FILE

BASE = {
    "rollout.prompts_per_rollout": "8",
    "rollout.n_samples_per_prompt": "8",
    "rollout.sampling.max_new_tokens": "4",
    "checkpoint.save_interval": "1000",  # only the forced save after the last iteration
    "eval.interval": "1000",
    "rollout.dynamic_sampling": "false",  # a fixed amount of work an iteration (bench.common.ONE_ROUND)
}
# ~10x the built-in model's parameters (0.14M -> 1.4M); same vocabulary and positions
LARGER_MODEL = {
    "model.tiny.hidden_size": "128",
    "model.tiny.num_layers": "5",
    "model.tiny.intermediate_size": "576",
}
KEYS = ("time_iteration_s", "time_generate_s", "time_train_s", "time_sync_s")


def parameters(over: dict[str, str]) -> int:
    """Parameter count of the built-in model with these model.tiny.* settings."""
    import torch
    from transformers import LlamaForCausalLM

    from infra.config import TinyModelConfig
    from infra.model.tiny import build_char_tokenizer, tiny_llama_config

    tiny = TinyModelConfig(**{k.removeprefix("model.tiny."): int(v) for k, v in over.items()})
    cfg = tiny_llama_config(tiny, build_char_tokenizer())
    with torch.device("meta"):
        return sum(p.numel() for p in LlamaForCausalLM(cfg).parameters())


def run(over: dict[str, str], iterations: int, sample_pss: bool = False) -> tuple[dict, dict]:
    """Median of each timing over iterations 2..N-1, and PSS by role near the end (if asked)."""
    import json

    settings = {**BASE, **over, "num_rollout": str(iterations), "checkpoint.resume": "fresh"}
    with tempfile.TemporaryDirectory() as tmp:
        name = f"scaling-{int(time.time())}"
        args = [f"{k}={v}" for k, v in settings.items()] + [f"storage.uri={tmp}", f"run_name={name}"]
        marks = [iterations - 3] if sample_pss else []  # not during the last save and shutdown
        columns = watch_flow(args, Path(tmp) / name, marks)
        rows = [json.loads(line) for line in (Path(tmp) / name / METRICS_FILE).read_text().splitlines()]
    steps = [r for r in rows if "time_iteration_s" in r and 2 <= r["rollout_id"] < iterations]
    medians = {k: statistics.median(r.get(k) or 0.0 for r in steps) for k in KEYS}
    return medians, next(iter(columns.values()), {})


def table(title: str, label: str, points: list[tuple[str, dict]]) -> None:
    print(f"\n{title} (seconds, median over iterations 2..N-1)")
    print(f"| {label} | iteration | generate | train | sync |")
    print("|---|---|---|---|---|")
    for name, m in points:
        print(f"| {name} | " + " | ".join(f"{m[k]:.2f}" for k in KEYS) + " |")


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--iterations", type=int, default=8)
    args = ap.parse_args(argv)
    n, t0 = args.iterations, time.monotonic()
    base, pss = run({}, n, sample_pss=True)
    batch = [
        (f"{p} x 8 = {p * 8}", run({"rollout.prompts_per_rollout": str(p)}, n)[0] if p != 8 else base)
        for p in (8, 16, 32)
    ]
    larger = run(LARGER_MODEL, n)[0]
    two_engines = run({"cluster.engines.num_workers": "2"}, n)[0]
    print(f"python -m flows.train {' '.join(f'{k}={v}' for k, v in BASE.items())} num_rollout={n}, then:")
    table("Rollout batch size (prompts x samples per prompt)", "samples", batch)
    small, big = parameters({}), parameters(LARGER_MODEL)
    table(
        "Model size (built-in tiny Llama)",
        "parameters",
        [
            (f"{small / 1e6:.2f}M (default)", base),
            (f"{big / 1e6:.2f}M ({', '.join(f'{k}={v}' for k, v in LARGER_MODEL.items())})", larger),
        ],
    )
    table("Rollout engines (cluster.engines.num_workers)", "engines", [("1", base), ("2", two_engines)])
    print(f"\nPSS in MiB (processes) by role, base run after {n - 3} iterations:")
    print_roles({"base run": pss})
    print(f"\nbench wall time {time.monotonic() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
