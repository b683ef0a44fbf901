"""A trainer rank's wait for its batch: carried by the train call, against staged ahead.

    python -m bench.batch_staging [--repeats 5]

One rank-like Ray actor (the project's FSDPRank with its batch inbox, no model) and a
holder of the batch in the object store, as the rollout manager is. Per batch shape,
alternating: the train call carries the batch's ref (Ray unpickles it before the method
runs), or the batch was staged while the rank's previous step
ran (a sleep, which leaves the cores free as a GPU step does) and the call finds it. The
figure is the time from the call's submit to the batch in hand, where the step would start.
This is the call alone, with free cores; on the 2-core demo the same work runs beside
training instead (`bench.loop_overhead`).
"""

from __future__ import annotations

import argparse
import random
import sys
import time

import ray

from bench.common import ratio_line, spread
from infra.cluster.ray_cluster import runtime_env
from infra.config import RunConfig
from infra.rollout.batch import RolloutBatch, Sample
from infra.system import actor_class
from infra.trainer.batch_inbox import FromManager
from infra.trainer.fsdp_rank import FSDPRank

# (samples, prompt tokens, response tokens): the demo's 64 x 16 samples of 1 token, then
# longer responses as RL on reasoning tasks makes them
SHAPES = [(1024, 10, 1), (1024, 64, 256), (512, 256, 2048)]
STEP_S = 2.0  # the previous step, during which a staged batch arrives


class _Rank(FSDPRank):
    def train(self, rollout_id: int, batch: RolloutBatch | FromManager, step_s: float = 0.0) -> float:
        """When this rank has the batch in hand (then a step of `step_s`)."""
        self.inbox.take(rollout_id, batch)
        ready = time.time()
        time.sleep(step_s)
        return ready


class _Holder:
    """Holds batches in the object store and answers with their refs, as the manager does."""

    def __init__(self) -> None:
        self.refs: dict[int, ray.ObjectRef] = {}

    def make(self, rollout_id: int, samples: int, prompt: int, response: int) -> None:
        rng = random.Random(rollout_id)
        self.refs[rollout_id] = ray.put(
            RolloutBatch(
                rollout_id,
                [
                    Sample(
                        prompt="p" * prompt,
                        label="l",
                        response="r" * response,
                        prompt_ids=[rng.randrange(32000) for _ in range(prompt)],
                        response_ids=[rng.randrange(32000) for _ in range(response)],
                        engine_logprobs=[-rng.random() for _ in range(response)],
                        weight_version=rollout_id,
                        group=i // 16,
                    )
                    for i in range(samples)
                ],
            )
        )

    def batch_ref(self, rollout_id: int) -> ray.ObjectRef:
        return self.refs[rollout_id]


def _carried(rank, holder, k: int) -> float:
    ref = ray.get(holder.batch_ref.remote(k))
    sent = time.time()
    return ray.get(rank.train.remote(k, ref)) - sent


def _staged(rank, holder, k: int) -> float:
    previous = rank.train.remote(k - 1, FromManager(holder), STEP_S)  # the step the batch arrives beside
    time.sleep(0.2)
    rank.stage_batch.remote(k, FromManager(holder))
    ray.get(previous)
    sent = time.time()
    return ray.get(rank.train.remote(k, FromManager(holder))) - sent


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.batch_staging", description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    ray.init(num_cpus=2, include_dashboard=False, runtime_env=runtime_env("", {}))
    try:
        rank = actor_class(_Rank).options(num_cpus=0).remote(RunConfig(), 0, 1)
        holder = ray.remote(_Holder).options(num_cpus=0).remote()
        k = 0
        for samples, prompt, response in SHAPES:
            times: dict[str, list[float]] = {"carried": [], "staged": []}
            for r in range(args.repeats + 1):  # the first pair warms up
                for side in ("carried", "staged") if r % 2 else ("staged", "carried"):
                    k += 2
                    ray.get([holder.make.remote(j, samples, prompt, response) for j in (k - 1, k)])
                    took = (_carried if side == "carried" else _staged)(rank, holder, k)
                    if r:
                        times[side].append(took)
            shape = f"{samples} samples x {prompt}+{response} tokens"
            for side, values in times.items():
                print(
                    f"{shape}, batch {side}: call to batch in hand, ms: {spread([1000 * v for v in values], '{:.1f}')}"
                )
            print(
                ratio_line(
                    f"trainer rank's wait for its batch, carried by the call / staged, {shape}",
                    [c / s for c, s in zip(times["carried"], times["staged"], strict=True)],
                    "none (diagnostic)",
                )
            )
            sys.stdout.flush()
        print(f"median carried / staged per shape; staged batches arrive during a {STEP_S:.0f} s step")
    finally:
        ray.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
