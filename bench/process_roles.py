"""PSS of every process of a run, grouped by what the process is (shared by the memory benches).

A run is the flow process and everything below it: the Prefect API server subprocess, Ray's
own processes (GCS, raylet, dashboard, log monitor, agents), Ray workers (their process
title names the actor class or `IDLE`) and the engine servers those workers start. PSS
splits shared pages between processes, so the sum counts each shared library once.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import psutil

T = TypeVar("T")

# first match wins: (substring of the command line, role)
_ROLES: list[tuple[str, str]] = [
    ("infra.engine_server.server", "engine server"),
    ("sglang.launch_server", "engine server"),
    ("gcs_server", "ray gcs"),
    ("raylet", "ray raylet"),
    ("dashboard", "ray dashboard/agents"),
    ("runtime_env", "ray dashboard/agents"),
    ("ray::DashboardAgent", "ray dashboard/agents"),
    ("ray::RuntimeEnvAgent", "ray dashboard/agents"),
    ("log_monitor", "ray log monitor"),
    ("monitor.py", "ray log monitor"),
    ("uvicorn", "prefect server"),
    ("prefect.server", "prefect server"),
    ("ray::IDLE", "ray task workers"),
]


def role_of(proc: psutil.Process, root_pid: int) -> str:
    if proc.pid == root_pid:
        return "flow (driver)"
    try:
        cmd = " ".join(proc.cmdline())
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return "gone"
    for needle, role in _ROLES:
        if needle in cmd:
            return role
    if cmd.startswith("ray::"):
        # `ray::TrainerRank.train` or `ray::RolloutManager`: the actor class is the role;
        # `ray::generate`, `ray::train`: a worker running Prefect task runs (idle between)
        name = cmd.split()[0][len("ray::") :].split(".")[0]
        return "ray " + name if name[:1].isupper() else "ray task workers"
    return "other: " + (proc.name() or "?")


def cpu_by_pid(root: psutil.Process) -> dict[int, tuple[str, float]]:
    """{pid: (role, CPU seconds so far)} over root and all its descendants."""
    out = {}
    for p in [root, *root.children(recursive=True)]:
        try:
            t = p.cpu_times()
            out[p.pid] = (role_of(p, root.pid), t.user + t.system)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return out


def pss_by_role(root: psutil.Process) -> dict[str, tuple[int, int]]:
    """{role: (summed PSS bytes, process count)} over root and all its descendants."""
    try:
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return {}
    sums: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for p in procs:
        try:
            info = p.memory_full_info()
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
        role = role_of(p, root.pid)
        sums[role][0] += getattr(info, "pss", info.rss)
        sums[role][1] += 1
    return {role: (v[0], v[1]) for role, v in sums.items()}


def print_roles(columns: dict[str, dict[str, tuple[int, int]]]) -> None:
    """One row per role, one column per sample (MiB, process count in brackets)."""
    roles = sorted({r for col in columns.values() for r in col})
    heads = list(columns)
    print("| role | " + " | ".join(heads) + " |")
    print("|---|" + "---|" * len(heads))
    for role in roles:
        cells = []
        for h in heads:
            pss, n = columns[h].get(role, (0, 0))
            cells.append(f"{pss / 2**20:.0f} ({n})" if n else "-")
        print(f"| {role} | " + " | ".join(cells) + " |")
    totals = [sum(v[0] for v in columns[h].values()) / 2**20 for h in heads]
    print("| **total** | " + " | ".join(f"{t:.0f}" for t in totals) + " |")


def iterations_done(metrics: Path) -> int:
    """Iterations a local run has finished: its metrics rows that carry time_iteration_s."""
    if not metrics.is_file():
        return 0
    return metrics.read_text().count('"time_iteration_s"')


def sample_median(root: psutil.Process, n: int = 3, gap_s: float = 1.0) -> dict[str, tuple[int, int]]:
    """pss_by_role, the median of n samples gap_s apart (one sample can catch a transient)."""
    samples = []
    for i in range(n):
        if i:
            time.sleep(gap_s)
        samples.append(pss_by_role(root))
    roles = {r for s in samples for r in s}
    return {
        r: (
            int(statistics.median(s.get(r, (0, 0))[0] for s in samples)),
            max(s.get(r, (0, 0))[1] for s in samples),
        )
        for r in roles
    }


def watch_flow(
    overrides: list[str],
    run_dir: Path,
    marks: list[int],
    sample: Callable[[psutil.Process], T] = sample_median,
    poll_s: float = 0.5,
) -> dict[str, T]:
    """Run `python -m flows.train overrides` (its log to stderr) and take `sample(root)`
    (PSS by role by default) when the run in run_dir has finished each of `marks`
    iterations, polling every `poll_s`; fails if the run fails."""
    proc = subprocess.Popen([sys.executable, "-m", "flows.train", *overrides], stdout=sys.stderr)
    root, t0 = psutil.Process(proc.pid), time.monotonic()
    columns: dict[str, T] = {}
    for mark in marks:
        while iterations_done(run_dir / "metrics.jsonl") < mark and proc.poll() is None:
            time.sleep(poll_s)
        if proc.poll() is not None:
            break
        columns[f"iter {mark}"] = sample(root)
        print(f"  sampled at iteration {mark} ({time.monotonic() - t0:.0f} s)", file=sys.stderr, flush=True)
    rc = proc.wait()
    if rc or len(columns) < len(marks):
        raise SystemExit(f"the run exited with {rc} after {len(columns)} of {len(marks)} marks")
    return columns
