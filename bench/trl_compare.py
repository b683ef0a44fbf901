"""Our samples/s against TRL's GRPOTrainer, at the demo's default shape and a small one.

    python -m bench.trl_compare [--iterations 10 --repeats 3] [--ranks 2 1] [--shapes default small]

Needs the optional bench dependencies (`pip install -e .[bench]`: TRL). Same tiny demo
model, same task (digit-copy, exact-match reward), same batch: the embedded defaults'
128 prompts x 8 samples x 1 new token (`default`) and 8 prompts x 8 samples x at most 4
new tokens (`small`), T=1, one optimizer step per batch, no KL. Ours keeps every group
(`bench.common.ONE_ROUND`): GRPOTrainer has no dynamic sampling, so both sides generate and
train the same samples. Ours is the Prefect flow of
the demo config (async, 1 built-in engine) with 2 FSDP2 trainer ranks (the default) and,
in the same run, with 1 (`cluster.trainer.num_workers=1`: on 2 cores the second rank
costs more in collectives than it adds), seconds per iteration from its
metrics rows (from one iteration's start to the next); TRL's is GRPOTrainer in one
process with all cores, seconds per optimizer step from a callback (one step's end to the
next). Both leave out their first iteration/step (warm-up); samples/s = batch / median
seconds. Where ours is slower, the median of every `time_*` figure of our
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
from bench.common import ONE_ROUND, ratio_line, spread, start_to_start
from infra.config_files import load_config
from infra.storage.fs import RunStore
from infra.storage.metrics import read_metrics

# prompts, samples per prompt, new tokens at most; each shape's ratio goal
SHAPES = {"default": (128, 8, 1), "small": (8, 8, 4)}
GOALS = {"default": ">= 1.0x", "small": ">= 0.5x"}


def _ours(
    shape: tuple[int, int, int], iterations: int, tmp: str, name: str, ranks: int
) -> tuple[float, dict]:
    prompts, samples, new_tokens = shape
    cfg = load_config(
        "configs/tiny-demo.yaml",
        [
            f"num_rollout={iterations}", f"storage.uri={tmp}", f"run_name={name}",
            f"rollout.prompts_per_rollout={prompts}", f"rollout.n_samples_per_prompt={samples}",
            f"rollout.sampling.max_new_tokens={new_tokens}", "eval.interval=null",
            f"cluster.trainer.num_workers={ranks}", *ONE_ROUND,
        ],
    )  # fmt: skip
    _run_flow(cfg)
    every = read_metrics(RunStore(cfg.storage, cfg.run_name))
    rows = [r for r in every if r.get("rollout_id", 0) > 0 and "time_iteration_s" in r]
    keys = sorted({k for r in rows for k in r if k.startswith("time_") and not k.endswith("_unix")})
    parts = {k: statistics.median(r[k] for r in rows if k in r) for k in keys}
    return statistics.median(start_to_start(every).values()), parts


def _trl(shape: tuple[int, int, int], steps: int, tmp: str) -> float:
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

    prompts, samples, new_tokens = shape
    dataset = Dataset.from_list([{"prompt": r["prompt"]} for r in rows[: prompts * (steps + 1)]])
    args = GRPOConfig(
        output_dir=os.path.join(tmp, "trl-out"), use_cpu=True, bf16=False, report_to=[], save_strategy="no",
        logging_strategy="no", disable_tqdm=True, max_steps=steps + 1, learning_rate=5e-3, beta=0.0,
        per_device_train_batch_size=prompts * samples, num_generations=samples, steps_per_generation=1,
        max_completion_length=new_tokens, temperature=1.0, top_k=0, top_p=1.0, seed=0,
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


def _compare(shape_name: str, iterations: int, repeats: int, ranks: list[int], tmp: str) -> dict:
    """samples/s of ours (per rank count) and TRL's, `repeats` times side by side."""
    shape = SHAPES[shape_name]
    batch = shape[0] * shape[1]
    ours: dict[int, list[float]] = {n: [] for n in ranks}
    parts: dict[int, dict] = {}
    theirs: list[float] = []
    for i in range(repeats):
        for n in ranks:
            seconds, parts[n] = _ours(shape, iterations, tmp, f"ours-{shape_name}-{n}-{i}", n)
            ours[n].append(batch / seconds)
        theirs.append(batch / _trl(shape, iterations, os.path.join(tmp, f"trl-{shape_name}-{i}")))
        mine = ", ".join(f"ours {n} rank(s) {ours[n][-1]:.1f}" for n in ranks)
        print(f"{shape_name} repeat {i}: {mine}, TRL {theirs[-1]:.1f} samples/s", flush=True)
    return {"ours": ours, "parts": parts, "theirs": theirs}


def _report(shape_name: str, iterations: int, result: dict) -> None:
    prompts, samples, new_tokens = SHAPES[shape_name]
    ours, theirs = result["ours"], result["theirs"]
    print(
        f"{shape_name}: {prompts} prompts x {samples} samples x <= {new_tokens} new tokens; {iterations} iterations each"
    )
    for n, figures in ours.items():
        print(f"ours (Prefect flow, {n} rank(s) + 1 engine) samples/s: {spread(figures, '{:.1f}')}")
    print(f"TRL GRPOTrainer (1 process, {os.cpu_count()} threads) samples/s: {spread(theirs, '{:.1f}')}")
    for n, figures in ours.items():
        ratios = [o / t for o, t in zip(figures, theirs, strict=True)]
        label = f"ours / TRL GRPOTrainer, samples/s, {shape_name} shape {prompts}x{samples}x{new_tokens}"
        print(ratio_line(label + ("" if n == 2 else f", {n} trainer rank(s)"), ratios, GOALS[shape_name]))
    for n, parts in result["parts"].items():
        print(
            f"our iteration with {n} rank(s), median ms per part (last repeat; the whole is start to start):"
        )
        for key, value in parts.items():
            print(f"  {key:32s} {value * 1000:8.1f} ms")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--iterations", type=int, default=10)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--ranks", type=int, nargs="+", default=[2, 1], help="trainer ranks of our runs")
    ap.add_argument("--shapes", nargs="+", choices=sorted(SHAPES), default=["default", "small"])
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        results = {s: _compare(s, args.iterations, args.repeats, args.ranks, tmp) for s in args.shapes}
    for shape_name, result in results.items():
        _report(shape_name, args.iterations, result)


if __name__ == "__main__":
    main()
