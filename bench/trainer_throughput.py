"""Trainer tokens/s: 2 FSDP2 ranks against 1 process, micro-batches by token budget
against micro-batches by sample count, and the old logprobs from the step's own forward
against a no-grad pass of their own, on the same batch, side by side in one run; then, on
a GRPO batch of short answers, a prompt's forward shared by its samples against one row each.

    python -m bench.trainer_throughput [--samples 256 --micro-batch 16 --repeats 3]

The batch: tiny demo model, prompts of 4-8 tokens, response lengths that vary as RL
rollouts do (80% of 2-12 tokens, 20% of 40-56). One train_on_batch call (one optimizer
step over the whole batch, AdamW; so the step's forward gives the old logprobs, except on
the line that asks for their pass) is timed per repeat, after one warm-up call; tokens/s
counts real prompt + response tokens (no padding). Every process runs one torch thread,
as trainer ranks do. The token budget is micro_batch_size x the longest row, so a
token-budget micro-batch is never larger than the sample-count path's largest one (same
peak memory).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import tempfile
import time
from pathlib import Path

import torch
import torch.multiprocessing as mp

from bench.common import ratio_line, spread
from tests.ports import free_port

ADDR = "127.0.0.1"


def batch(n: int, seed: int = 0) -> list:
    from infra.rollout.batch import Sample

    g = random.Random(seed)
    out = []
    for i in range(n):
        length = g.randint(2, 12) if g.random() < 0.8 else g.randint(40, 56)
        response = [g.randrange(4, 30) for _ in range(length)]
        out.append(
            Sample(
                prompt="", label="", response="", prompt_ids=[g.randrange(4, 30) for _ in range(g.randint(4, 8))],
                response_ids=response, engine_logprobs=[-3.0] * length, weight_version=0, group=i // 8,
                reward=float(i % 2), advantage=g.uniform(-1, 1),
            )
        )  # fmt: skip
    return out


def grpo_batch(num_samples: int, copies: int = 8, seed: int = 0) -> list:
    """A GRPO rollout of short answers: `copies` samples of each prompt (8-12 tokens), each
    response 1-4 tokens, so one prompt's forward serves its group (`shared_prompt_forward`)."""
    from infra.rollout.batch import Sample

    g = random.Random(seed)
    out = []
    for group in range(num_samples // copies):
        prompt = [g.randrange(4, 30) for _ in range(g.randint(8, 12))]
        for _ in range(copies):
            response = [g.randrange(4, 30) for _ in range(g.randint(1, 4))]
            out.append(
                Sample(
                    prompt="", label="", response="", prompt_ids=prompt, response_ids=response,
                    engine_logprobs=[-3.0] * len(response), weight_version=0, group=group,
                    reward=float(g.random() < 0.5), advantage=g.uniform(-1, 1),
                )
            )  # fmt: skip
    return out


def _worker(rank: int, world_size: int, port: int, model_dir: str, alg: dict, repeats: int, out: str) -> None:
    from transformers import AutoModelForCausalLM

    from infra.config import AlgorithmConfig
    from infra.trainer.parallelize import init_distributed, parallelize
    from infra.trainer.step import train_on_batch

    torch.set_num_threads(1)
    if world_size > 1:
        init_distributed(rank, world_size, ADDR, port)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    gather = alg.pop("gather", "per_step")
    old_pass = alg.pop("old_pass", False)
    model = parallelize(model, world_size, gather) if world_size > 1 else model
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0)
    num_samples = alg.pop("samples")
    samples = grpo_batch(num_samples) if alg.pop("grpo", False) else batch(num_samples)
    cfg = AlgorithmConfig(**alg)
    times = []
    for _ in range(repeats + 1):  # the first call warms up
        t0 = time.perf_counter()
        train_on_batch(
            model, optimizer, scheduler, samples, rank=rank, world_size=world_size, cfg=cfg,
            global_batch_size=len(samples), temperature=1.0, max_response_len=56, old_pass=old_pass,
        )  # fmt: skip
        times.append(time.perf_counter() - t0)
    if rank == 0:
        Path(out).write_text(json.dumps(times[1:]))
    if world_size > 1:
        torch.distributed.destroy_process_group()


def measure(model_dir: str, world_size: int, alg: dict, repeats: int, tmp: str) -> list[float]:
    out = str(Path(tmp) / "times.json")
    args = (world_size, free_port(), model_dir, alg, repeats, out)
    mp.start_processes(_worker, args=args, nprocs=world_size, start_method="spawn", join=True)
    return json.loads(Path(out).read_text())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--samples", type=int, default=256)
    ap.add_argument("--micro-batch", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    from infra.config import TinyModelConfig
    from infra.model.tiny import build_tiny_model

    samples = batch(args.samples)
    tokens = sum(len(s.prompt_ids) + len(s.response_ids) for s in samples)
    longest = max(len(s.prompt_ids) + len(s.response_ids) for s in samples)
    by_count = {"samples": args.samples, "micro_batch_size": args.micro_batch}
    budget = args.micro_batch * longest
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = str(build_tiny_model(Path(tmp) / "model", TinyModelConfig()))
        runs = _runs(model_dir, by_count, budget, args.repeats, tmp)
        grpo = {"samples": 1024, "grpo": True}
        shared = measure(model_dir, 1, dict(grpo), args.repeats, tmp)
        plain = measure(model_dir, 1, {**grpo, "shared_prompt_forward": False}, args.repeats, tmp)
    print(
        f"tiny demo model; {args.samples} samples, {tokens} tokens (longest row {longest}); "
        f"micro_batch_size {args.micro_batch}, micro_batch_tokens {budget}; 1 thread per process"
    )
    rates = {name: [tokens / t for t in times] for name, times in runs.items()}
    for name, values in rates.items():
        print(f"{name:44s} tokens/s: {spread(values, '{:.0f}')}")
    _report_ratios(*rates.values())
    print(f"median step time: {', '.join(f'{n} {statistics.median(t):.2f} s' for n, t in runs.items())}")
    _report_shared(shared, plain)


def _report_shared(shared: list[float], plain: list[float]) -> None:
    """A prompt's forward shared by its group against one row per sample, on a GRPO batch."""
    print(
        "GRPO batch: 128 prompts of 8-12 tokens x 8 samples of 1-4 tokens, 1 process; median step "
        f"time shared prompt forward {statistics.median(shared):.3f} s, one row per sample "
        f"{statistics.median(plain):.3f} s"
    )
    ratios = [p / s for s, p in zip(shared, plain, strict=True)]
    print(
        ratio_line("trainer shared prompt forward / one row per sample (GRPO batch), steps/s", ratios, "> 1x")
    )


def _runs(model_dir: str, by_count: dict, budget: int, repeats: int, tmp: str) -> dict[str, list[float]]:
    """Every measured setup's step times, in the order `_report_ratios` takes them."""
    by_tokens = {**by_count, "micro_batch_tokens": budget}
    return {
        "1 process, by count": measure(model_dir, 1, dict(by_count), repeats, tmp),
        "2 ranks, by count": measure(model_dir, 2, dict(by_count), repeats, tmp),
        "2 ranks, by count, gathered per micro-batch": measure(
            model_dir, 2, {**by_count, "gather": "per_micro_batch"}, repeats, tmp
        ),
        "2 ranks, by tokens": measure(model_dir, 2, dict(by_tokens), repeats, tmp),
        "2 ranks, by count, old-logprob pass": measure(
            model_dir, 2, {**by_count, "old_pass": True}, repeats, tmp
        ),
    }


def _report_ratios(
    one: list[float], two: list[float], per_mb: list[float], packed: list[float], old_pass: list[float]
) -> None:
    """The tokens/s ratios between the setups (`_runs`' order)."""
    ratios = [
        ("trainer 2 FSDP2 ranks / 1 process, tokens/s", one, two, "> 1x"),
        (
            "trainer token-budget / sample-count micro-batches (2 ranks), tokens/s",
            two,
            packed,
            "> 1x when lengths vary",
        ),
        (
            "trainer weights gathered once per step / per micro-batch (2 ranks), tokens/s",
            per_mb,
            two,
            "none (diagnostic)",
        ),
        (
            "trainer old logprobs from the step's forward / from a pass of their own (2 ranks), tokens/s",
            old_pass,
            two,
            "none (diagnostic)",
        ),
    ]
    for label, base, measured, expected in ratios:
        print(ratio_line(label, [b / a for a, b in zip(base, measured, strict=True)], expected))


if __name__ == "__main__":
    main()
