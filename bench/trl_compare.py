"""Our samples/s against TRL's GRPOTrainer at 8 prompts x 8 samples x 4 new tokens.

    python -m bench.trl_compare [--iterations 10 --repeats 3] [--ranks 2 1]

Needs the optional bench dependencies (`pip install -e .[bench]`: TRL). Same tiny demo
model, same task (digit-copy, exact-match reward), same batch: 8 prompts x 8 samples, at
most 4 new tokens, T=1, one optimizer step per batch, no KL. Ours is the Prefect flow of
the demo config (async, 1 built-in engine) with 2 FSDP2 trainer ranks (the default) and,
in the same run, with 1 (`cluster.trainer.num_workers=1`: on 2 cores the second rank
costs more in collectives than it adds), seconds per iteration from its
metrics rows (from one iteration's start to the next); TRL's is GRPOTrainer in one
process with all cores, seconds per optimizer step from a callback (one step's end to the
next). Both leave out their first iteration/step (warm-up); samples/s =
64 / median seconds. Where ours is slower, the median of every `time_*` figure of our
metrics rows says where its iteration goes.
"""

from __future__ import annotations

import argparse
import itertools
import os
import statistics
import tempfile
import time

from bench.asyncio_driver import _run_flow
from bench.common import ratio_line, spread, start_to_start
from infra.config_files import load_config
from infra.storage.fs import RunStore
from infra.storage.metrics import read_metrics

PROMPTS, SAMPLES, NEW_TOKENS = 8, 8, 4


def _ours(iterations: int, tmp: str, name: str, ranks: int) -> tuple[float, dict]:
    cfg = load_config(
        "configs/tiny-demo.yaml",
        [
            f"num_rollout={iterations}", f"storage.uri={tmp}", f"run_name={name}",
            f"rollout.prompts_per_rollout={PROMPTS}", f"rollout.n_samples_per_prompt={SAMPLES}",
            f"rollout.sampling.max_new_tokens={NEW_TOKENS}", "eval.interval=null",
            f"cluster.trainer.num_workers={ranks}",
        ],
    )  # fmt: skip
    _run_flow(cfg)
    every = read_metrics(RunStore(cfg.storage, cfg.run_name))
    rows = [r for r in every if r.get("rollout_id", 0) > 0 and "time_iteration_s" in r]
    keys = sorted({k for r in rows for k in r if k.startswith("time_") and not k.endswith("_unix")})
    parts = {k: statistics.median(r[k] for r in rows if k in r) for k in keys}
    return statistics.median(start_to_start(every).values()), parts


def _trl(steps: int, tmp: str) -> float:
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from infra.config import TinyModelConfig
    from infra.data.builtin_tasks import builtin_rows
    from infra.model.tiny import build_tiny_model

    model_dir = build_tiny_model(os.path.join(tmp, "trl-model"), TinyModelConfig())
    rows = builtin_rows("digit-copy", "train")
    labels = {r["prompt"]: r["label"] for r in rows}

    def reward(prompts: list[str], completions: list[str], **kw) -> list[float]:
        return [float(c.strip() == labels[p]) for p, c in zip(prompts, completions, strict=True)]

    class StepTimes(TrainerCallback):
        def __init__(self) -> None:
            self.marks: list[float] = []

        def on_step_end(self, args, state, control, **kw):
            self.marks.append(time.perf_counter())

    dataset = Dataset.from_list([{"prompt": r["prompt"]} for r in rows[: PROMPTS * (steps + 1)]])
    args = GRPOConfig(
        output_dir=os.path.join(tmp, "trl-out"), use_cpu=True, bf16=False, report_to=[], save_strategy="no",
        logging_strategy="no", disable_tqdm=True, max_steps=steps + 1, learning_rate=5e-3, beta=0.0,
        per_device_train_batch_size=PROMPTS * SAMPLES, num_generations=SAMPLES, steps_per_generation=1,
        max_completion_length=NEW_TOKENS, temperature=1.0, top_k=0, top_p=1.0, seed=0,
        gradient_checkpointing=False,  # its default trades time for memory a tiny model does not need
    )  # fmt: skip
    timer = StepTimes()
    torch.set_num_threads(os.cpu_count() or 1)
    trainer = GRPOTrainer(
        model=AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32),
        reward_funcs=reward,
        args=args,
        train_dataset=dataset,
        processing_class=AutoTokenizer.from_pretrained(model_dir),
        callbacks=[timer],
    )
    trainer.train()
    gaps = [b - a for a, b in itertools.pairwise(timer.marks)]  # step 0 (warm-up) left out
    return statistics.median(gaps)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--iterations", type=int, default=10)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--ranks", type=int, nargs="+", default=[2, 1], help="trainer ranks of our runs")
    args = ap.parse_args()
    batch = PROMPTS * SAMPLES
    ours: dict[int, list[float]] = {n: [] for n in args.ranks}
    parts: dict[int, dict] = {}
    theirs: list[float] = []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.repeats):
            for n in args.ranks:
                seconds, parts[n] = _ours(args.iterations, tmp, f"ours-{n}-{i}", n)
                ours[n].append(batch / seconds)
            theirs.append(batch / _trl(args.iterations, os.path.join(tmp, f"trl-{i}")))
            mine = ", ".join(f"ours {n} rank(s) {ours[n][-1]:.1f}" for n in args.ranks)
            print(f"repeat {i}: {mine}, TRL {theirs[-1]:.1f} samples/s", flush=True)
    print(
        f"{PROMPTS} prompts x {SAMPLES} samples x <= {NEW_TOKENS} new tokens; {args.iterations} iterations each"
    )
    for n in args.ranks:
        print(f"ours (Prefect flow, {n} rank(s) + 1 engine) samples/s: {spread(ours[n], '{:.1f}')}")
    print(f"TRL GRPOTrainer (1 process, {os.cpu_count()} threads) samples/s: {spread(theirs, '{:.1f}')}")
    for n in args.ranks:
        ratios = [o / t for o, t in zip(ours[n], theirs, strict=True)]
        label = "ours / TRL GRPOTrainer, samples/s" + ("" if n == 2 else f", {n} trainer rank(s)")
        print(ratio_line(label, ratios, ">= 0.5x"))
    for n in args.ranks:
        print(
            f"our iteration with {n} rank(s), median ms per part (last repeat; the whole is start to start):"
        )
        for key, value in parts[n].items():
            print(f"  {key:32s} {value * 1000:8.1f} ms")


if __name__ == "__main__":
    main()
