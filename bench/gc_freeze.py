"""What Python's garbage collector costs a long-lived process of the loop, with and without
its start-up heap frozen (infra/heap.py).

    python -m bench.gc_freeze [--repeats 5] [--calls 40]

In one process that holds what a trainer rank or an engine server holds after start-up
(torch, transformers and a tiny Llama built from the demo's config), the work a rank does
each iteration that allocates the most Python objects: unpickling the demo's rollout batch
(1024 samples, their own strings and token lists). First, once, what a full collection
finds and costs right after start-up. Then each repeat runs `--calls` of them with
the heap as imported, then with it frozen (`freeze_startup_heap`), then thaws it again
(`gc.unfreeze`) for the next repeat; the figure is the CPU time per call, which includes the
full collections that the allocations set off now and then.
"""

from __future__ import annotations

import argparse
import gc
import pickle
import random
import statistics
import sys
import time

from bench.common import ratio_line, spread
from infra.heap import freeze_startup_heap
from infra.rollout.batch import RolloutBatch, Sample


def demo_batch(seed: int = 0, samples: int = 1024) -> RolloutBatch:
    """A rollout of the demo's shape: 64 prompts x 16 samples of one token."""
    rng = random.Random(seed)
    rows = []
    for i in range(samples):
        digit = str(rng.randrange(10))
        rows.append(
            Sample(
                prompt=f"{digit}=",
                label=digit,
                response=str(rng.randrange(10)),
                prompt_ids=[rng.randrange(100) for _ in range(2)],
                response_ids=[rng.randrange(100)],
                engine_logprobs=[-rng.random()],
                weight_version=3,
                group=i // 16,
                reward=float(rng.random() < 0.5),
                advantage=rng.gauss(0.0, 1.0),
                finish_reason="length",
            )
        )
    return RolloutBatch(3, rows)


def load_like_a_rank() -> object:
    """What a trainer rank has imported and built by the time it trains."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from infra.config import RunConfig

    tiny = RunConfig().model.tiny
    config = LlamaConfig(
        vocab_size=128,
        hidden_size=tiny.hidden_size,
        num_hidden_layers=tiny.num_layers,
        num_attention_heads=tiny.num_heads,
        intermediate_size=tiny.intermediate_size,
        max_position_embeddings=tiny.max_position_embeddings,
    )
    torch.manual_seed(0)
    return LlamaForCausalLM(config)


def cpu_ms_per_call(blob: bytes, calls: int) -> float:
    start = time.process_time()
    for _ in range(calls):
        pickle.loads(blob)
    return 1000 * (time.process_time() - start) / calls


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.gc_freeze", description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--calls", type=int, default=40)
    args = ap.parse_args(argv)
    model = load_like_a_rank()
    blob = pickle.dumps(demo_batch(), protocol=5)
    print(f"objects the collector tracks after start-up: {len(gc.get_objects())}")
    start = time.process_time()
    found = gc.collect()  # what freeze_startup_heap leaves out: a full collection first
    print(
        f"a full collection after start-up: {1000 * (time.process_time() - start):.1f} CPU-ms, {found} unreachable"
    )
    times: dict[str, list[float]] = {"as imported": [], "frozen": []}
    for _ in range(args.repeats):
        gc.unfreeze()
        times["as imported"].append(cpu_ms_per_call(blob, args.calls))
        frozen = freeze_startup_heap()
        times["frozen"].append(cpu_ms_per_call(blob, args.calls))
    gc.unfreeze()
    print(f"objects frozen: {frozen}")
    for side, values in times.items():
        print(f"heap {side}: CPU ms per unpickled 1024-sample batch: {spread(values, '{:.2f}')}")
    ratios = [a / f for a, f in zip(times["as imported"], times["frozen"], strict=True)]
    print(ratio_line("CPU per unpickled demo batch, heap as imported / frozen", ratios, "> 1x"))
    print(
        f"median saved per call: {statistics.median(times['as imported']) - statistics.median(times['frozen']):.2f} ms"
    )
    del model
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
