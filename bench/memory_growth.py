"""Does memory stay flat over a long run? PSS of every process of the run, by role, at
iteration 50 and every 50 iterations up to the last.

    python -m bench.memory_growth [--iterations 500] [--every 50] [overrides...]

Runs `python -m flows.train` (8 prompts x 8 samples x 4 new tokens, every group kept, the demo's checkpoint
and eval intervals) in a child process with a fresh run folder, watches the run's
metrics.jsonl for the iteration count, and at each mark sums PSS over the flow process
and all its descendants (Prefect API server, Ray's processes, Ray workers and actors,
engine servers), grouped by role. Each mark is the median of 3 samples one second apart.
The run goes a few iterations past the last mark so that mark is not the shutdown.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

from bench.common import ONE_ROUND, ratio_line
from bench.process_roles import print_roles, watch_flow

OVERRIDES = [
    "rollout.prompts_per_rollout=8",
    "rollout.n_samples_per_prompt=8",
    "rollout.sampling.max_new_tokens=4",
    "checkpoint.resume=fresh",
    *ONE_ROUND,
]


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--iterations", type=int, default=500, help="the last mark")
    ap.add_argument("--every", type=int, default=50, help="iterations between marks; the first mark too")
    ap.add_argument("overrides", nargs="*", help="more key.path=value settings")
    args = ap.parse_args(argv)
    marks = list(range(args.every, args.iterations + 1, args.every))
    settings = [*OVERRIDES, f"num_rollout={args.iterations + 5}", *args.overrides]
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        name = f"memory-{int(time.time())}"
        columns = watch_flow([*settings, f"storage.uri={tmp}", f"run_name={name}"], Path(tmp) / name, marks)
    print(f"python -m flows.train {' '.join(settings)}")
    print(f"wall time {time.monotonic() - t0:.0f} s; PSS in MiB (processes) by role:")
    print_roles(columns)
    first, last = (sum(v[0] for v in columns[f"iter {m}"].values()) for m in (marks[0], marks[-1]))
    print(
        f"total PSS: iteration {marks[0]} {first / 2**30:.2f} GiB, iteration {marks[-1]} {last / 2**30:.2f} GiB"
    )
    print(ratio_line(f"summed PSS, iteration {marks[-1]} / iteration {marks[0]}", [last / first], "<= 1.10x"))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
