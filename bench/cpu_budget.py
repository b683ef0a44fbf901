"""Where the CPU of a steady-state iteration goes, by process role.

    python -m bench.cpu_budget [--from 5 --to 25] [overrides...]

Runs `python -m flows.train` twice, every group kept (`bench.common.LOOP_SHAPE`): the demo
at 64 prompts x 16 samples and TRL's batch shape of
bench/trl_compare.py (8 prompts x 8 samples x 4 new tokens, 1 trainer rank), each with
the overrides, and reads every process's CPU time (user + system, from /proc through
psutil) when the run has finished `--from` iterations and again at `--to`; the difference over the iterations between, per process
role (bench/process_roles.py), is the CPU each iteration costs there. Against it stands
the wall time of those iterations times the cores: on a machine where the loop is bound
by CPU, what the trainer ranks do not use is what orchestration, generation and the
services cost. A process that starts and ends between the two reads is not counted.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

from bench.common import LOOP_SHAPE
from bench.process_roles import cpu_by_pid, watch_flow

# the second run: bench/trl_compare.py's batch, with the trainer layout that does best there
TRL_SHAPE = [
    "rollout.prompts_per_rollout=8", "rollout.n_samples_per_prompt=8", "rollout.sampling.max_new_tokens=4",
    "eval.interval=null", "cluster.trainer.num_workers=1",
]  # fmt: skip


def budget(first: int, last: int, overrides: list[str]) -> None:
    """One run; prints CPU ms per iteration by role over iterations first..last."""
    with tempfile.TemporaryDirectory() as tmp:
        settings = [
            f"num_rollout={last + 2}", f"storage.uri={tmp}", "run_name=cpu", "checkpoint.resume=fresh", *overrides,
        ]  # fmt: skip
        print("python -m flows.train " + " ".join(settings[1:]))
        # polled often: a read late by one poll stretches the window it measures
        reads = watch_flow(
            settings,
            Path(tmp) / "cpu",
            [first, last],
            lambda root: (time.monotonic(), cpu_by_pid(root)),
            0.05,
        )
    (t0, before), (t1, after) = reads.values()
    n = last - first
    per_role: dict[str, float] = defaultdict(float)
    for pid, (role, cpu) in after.items():
        per_role[role] += cpu - before.get(pid, (role, 0.0))[1]
    wall, cores = (t1 - t0) / n, os.cpu_count() or 1
    print(f"iterations {first}..{last}: {wall * 1000:.0f} ms wall each, {cores} cores")
    print("| role | CPU ms per iteration | share of wall x cores |")
    print("|---|---|---|")
    for role, cpu in sorted(per_role.items(), key=lambda kv: -kv[1]):
        print(f"| {role} | {cpu / n * 1000:.0f} | {cpu / n / (wall * cores):.0%} |")
    total = sum(per_role.values()) / n
    print(f"| **total** | {total * 1000:.0f} | {total / (wall * cores):.0%} |", flush=True)


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.cpu_budget", description=__doc__.split("\n")[0])
    ap.add_argument("--from", dest="first", type=int, default=5)
    ap.add_argument("--to", dest="last", type=int, default=25)
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_args(argv)
    for shape in ([], TRL_SHAPE):
        budget(args.first, args.last, [*LOOP_SHAPE, *shape, *args.overrides])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
