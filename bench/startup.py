"""Start-up time of the demo: from the command to the first generate, phase by phase.

    python -m bench.startup [--repeats 3] [--baseline GIT_REF] [overrides...]

Runs `python -m flows.train num_rollout=1` (the demo's defaults, a fresh run folder each
time) in a child process and reads the run's `startup.json` (infra/startup.py): the time
each start-up phase ended. With `--baseline`, the same command also runs from a checkout
of that commit (which must write startup.json too), alternating with this code's runs so
both see the same machine load. Every figure is seconds since this script launched the command,
median (min, max) over the repeats; `step` is the median time since the run's previous
mark, i.e. what the phase added. Phases that overlap end in an order of their own, so the
table is ordered by median end time. The demo's own log goes to stderr.

While a run starts, its process tree is read every 0.2 s for each process's CPU time
(bench/process_roles.py); the second table sums it by process role up to the first
generate, against the cores times that wall time: where the start-up's work is, and how
much of the machine it kept busy.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import psutil

from bench.common import ratio_line, sides, spread
from bench.process_roles import cpu_by_pid
from infra.config_files import load_config
from infra.handles import STARTUP_FILE
from infra.storage.fs import RunStore

# how often the run's processes are read for their CPU time
CPU_POLL_S = 0.2


def run_once(overrides: list[str], code: Path) -> tuple[dict[str, float], float, dict[str, float]]:
    """One demo run of the code in `code`: each mark as seconds since the command, the exit
    time, and the CPU seconds each process role had used when the first generate started."""
    t0 = time.time()
    cmd = [sys.executable, "-m", "flows.train", *overrides]
    proc = subprocess.Popen(cmd, cwd=code, stdout=sys.stderr)
    samples = _sample_cpu(proc)
    exit_s = time.time() - t0
    if proc.returncode:
        raise SystemExit(f"the demo exited with {proc.returncode}")
    cfg = load_config(None, overrides)
    report = json.loads(RunStore(cfg.storage, cfg.run_name).read_text(STARTUP_FILE))
    marks = {"process_started": report["process_start_unix"] - t0}
    marks.update({phase: at - t0 for phase, at in report["marks_unix"].items()})
    return marks, exit_s, cpu_until(samples, report["marks_unix"]["first_generate_started"])


def _sample_cpu(proc: subprocess.Popen) -> list[tuple[float, dict[int, tuple[str, float]]]]:
    """(unix time, cpu_by_pid) of the run's process tree every CPU_POLL_S until it exits."""
    root, samples = psutil.Process(proc.pid), []
    while proc.poll() is None:
        try:
            samples.append((time.time(), cpu_by_pid(root)))
        except psutil.NoSuchProcess:  # the flow process exited between poll and read
            break
        time.sleep(CPU_POLL_S)
    proc.wait()
    return samples


def cpu_until(samples: list[tuple[float, dict[int, tuple[str, float]]]], at_unix: float) -> dict[str, float]:
    """CPU seconds per role up to `at_unix`: each process's last reading before it (a
    process that ended earlier keeps its last reading; its title then names its role)."""
    last: dict[int, tuple[str, float]] = {}
    for t, reads in samples:
        if t > at_unix:
            break
        last.update(reads)
    by_role: dict[str, float] = defaultdict(float)
    for role, cpu in last.values():
        by_role[role] += cpu
    return dict(by_role)


def _load() -> str:
    return ", ".join(f"{x:.2f}" for x in os.getloadavg())


def report(name: str, runs: list[dict[str, float]], exits: list[float]) -> dict[str, list[float]]:
    """Print one side's table; returns its headline figures."""
    steps = []  # per run: phase -> seconds since that run's previous mark
    for marks in runs:
        ordered = sorted(marks.items(), key=lambda item: item[1])
        steps.append({p: at - (ordered[i - 1][1] if i else 0.0) for i, (p, at) in enumerate(ordered)})
    phases = sorted(
        {p for m in runs for p in m}, key=lambda p: statistics.median(m[p] for m in runs if p in m)
    )
    print(
        f"{name}: phase ends at, seconds since the command: median (min, max, n); step = median since the previous mark"
    )
    for phase in phases:
        ends = [m[phase] for m in runs if phase in m]
        step = statistics.median(s[phase] for s in steps if phase in s)
        print(f"  {phase:24s} {spread(ends, '{:.2f}')}  step {step:.2f}")
    heads = {
        "command to first generate start": [m["first_generate_started"] for m in runs],
        "command to first generate end": [m["first_generate_done"] for m in runs],
        "command to exit": exits,
    }
    for label, values in heads.items():
        print(f"{name}: {label}: {spread(values, '{:.2f}')} s")
    return heads


def report_cpu(name: str, cpus: list[dict[str, float]], runs: list[dict[str, float]]) -> None:
    """What the processes did before the first generate: on a machine with few cores the
    start-up is as long as its CPU work divided by the cores, whatever overlaps."""
    cores = os.cpu_count() or 1
    totals = [sum(c.values()) for c in cpus]
    capacity = [m["first_generate_started"] * cores for m in runs]
    print(
        f"{name}: CPU seconds used from the command to the first generate, by process role: median (min, max, n)"
    )
    roles = sorted(
        {r for c in cpus for r in c}, key=lambda r: -statistics.median(c.get(r, 0.0) for c in cpus)
    )
    for role in roles:
        print(f"  {role:24s} {spread([c.get(role, 0.0) for c in cpus], '{:.2f}')}")
    print(f"  {'total':24s} {spread(totals, '{:.2f}')}")
    busy = [t / c for t, c in zip(totals, capacity, strict=True)]
    print(f"{name}: share of {cores} cores x time to the first generate in use: {spread(busy, '{:.0%}')}")
    print()


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--baseline", help="a commit to measure too, alternating with this code")
    ap.add_argument("overrides", nargs="*", help="key.path=value settings for the demo")
    args = ap.parse_args(argv)
    print(f"python -m flows.train num_rollout=1 {' '.join(args.overrides)}: {args.repeats} runs per side")
    # other work on the machine shifts every figure: its load is part of the result
    print(f"load average (1, 5, 15 min) before the runs: {_load()}")
    with tempfile.TemporaryDirectory() as tmp:
        code_of = sides(args.baseline, Path(tmp))
        runs: dict[str, list] = {name: [] for name in code_of}
        for i in range(args.repeats):
            for j, (name, code) in enumerate(code_of.items()):
                overrides = [
                    "num_rollout=1",
                    "checkpoint.resume=fresh",
                    f"run_name=startup-{i}",
                    *args.overrides,
                    f"storage.uri={tmp}/run{i}-{j}",
                ]
                runs[name].append(run_once(overrides, code))
    print(f"load average (1, 5, 15 min) after the runs: {_load()}\n")
    heads = {}
    for name, rs in runs.items():
        heads[name] = report(name, [r[0] for r in rs], [r[1] for r in rs])
        report_cpu(name, [r[2] for r in rs], [r[0] for r in rs])
    if len(heads) == 2:
        (_, before), (_, after) = heads.items()
        key = "command to first generate start"
        ratios = [b / a for b, a in zip(before[key], after[key], strict=True)]
        print(
            ratio_line(
                "startup, baseline / this code (command to first generate)",
                ratios,
                "first generate within 15 s",
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
