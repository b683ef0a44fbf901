"""Start-up time of the demo: from the command to the first generate, phase by phase.

    python -m bench.startup [--repeats 3] [overrides...]

Runs `python -m flows.train num_rollout=1` (the demo's defaults, a fresh run folder each
time) in a child process and reads the run's `startup.json` (infra/startup.py): the time
each start-up phase ended. Every figure is seconds since this script launched the command,
median (min, max) over the repeats; `step` is the median time since the run's previous
mark, i.e. what the phase added. Phases that overlap end in an order of their own, so the
table is ordered by median end time. The demo's own log goes to stderr.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time

from bench.common import spread
from infra.config_files import load_config
from infra.handles import STARTUP_FILE
from infra.storage.fs import RunStore


def run_once(overrides: list[str]) -> tuple[dict[str, float], float]:
    """One demo run: each mark as seconds since the command, and the exit time."""
    t0 = time.time()
    proc = subprocess.run([sys.executable, "-m", "flows.train", *overrides], stdout=sys.stderr, check=False)
    exit_s = time.time() - t0
    if proc.returncode:
        raise SystemExit(f"the demo exited with {proc.returncode}")
    cfg = load_config(None, overrides)
    report = json.loads(RunStore(cfg.storage, cfg.run_name).read_text(STARTUP_FILE))
    marks = {"process_started": report["process_start_unix"] - t0}
    marks.update({phase: at - t0 for phase, at in report["marks_unix"].items()})
    return marks, exit_s


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("overrides", nargs="*", help="key.path=value settings for the demo")
    args = ap.parse_args(argv)
    runs, exits = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.repeats):
            overrides = [
                "num_rollout=1",
                "checkpoint.resume=fresh",
                f"run_name=startup-{i}",
                *args.overrides,
                f"storage.uri={tmp}/run{i}",
            ]
            marks, exit_s = run_once(overrides)
            runs.append(marks)
            exits.append(exit_s)
    steps = []  # per run: phase -> seconds since that run's previous mark
    for marks in runs:
        ordered = sorted(marks.items(), key=lambda item: item[1])
        steps.append({p: at - (ordered[i - 1][1] if i else 0.0) for i, (p, at) in enumerate(ordered)})
    phases = sorted(
        {p for m in runs for p in m}, key=lambda p: statistics.median(m[p] for m in runs if p in m)
    )
    print(f"python -m flows.train num_rollout=1 {' '.join(args.overrides)}: {args.repeats} runs")
    print(
        "phase ends at, seconds since the command: median (min, max, n); step = median time since the previous mark"
    )
    for phase in phases:
        ends = [m[phase] for m in runs if phase in m]
        step = statistics.median(s[phase] for s in steps if phase in s)
        print(f"  {phase:24s} {spread(ends, '{:.2f}')}  step {step:.2f}")
    print(
        f"command to first generate start: {spread([m['first_generate_started'] for m in runs], '{:.2f}')} s"
    )
    print(f"command to first generate end: {spread([m['first_generate_done'] for m in runs], '{:.2f}')} s")
    print(f"command to exit: {spread(exits, '{:.2f}')} s")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
