"""Where a run's start-up time goes: named marks, in seconds since the process started.

The driver calls `mark(phase)` as each start-up phase ends; `timeline()` gives every mark
in order as seconds since this process was created (the command), so one look says which
phase is slow. Marks hold wall-clock time, so a phase that ends in another process (the
first generate runs on a Ray worker) is added with `mark(phase, at=unix_time)`.
"""

from __future__ import annotations

import os
import time

import psutil


def _process_start_unix() -> float:
    """Wall-clock time this process was created. On Linux from its age since boot (10 ms
    ticks): psutil's create_time adds the boot time in whole seconds, up to 1 s off."""
    try:
        with open("/proc/self/stat") as f:
            started_ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        return time.time() - (uptime - started_ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return psutil.Process().create_time()


PROCESS_START_UNIX: float = _process_start_unix()
_marks: dict[str, float] = {}


def mark(phase: str, at: float | None = None) -> None:
    """Record that `phase` ended now (or at unix time `at`); a repeated phase keeps its first mark."""
    _marks.setdefault(phase, time.time() if at is None else at)


def timeline() -> dict[str, float]:
    """Every mark so far, in time order: phase -> seconds since the process started."""
    ordered = sorted(_marks.items(), key=lambda item: item[1])
    return {phase: round(at - PROCESS_START_UNIX, 3) for phase, at in ordered}


def marks_unix() -> dict[str, float]:
    """Every mark as unix time (for a caller that measures from its own clock, e.g. a bench)."""
    return dict(sorted(_marks.items(), key=lambda item: item[1]))


def reset() -> None:
    """Forget every mark (a second run in the same process starts a fresh timeline)."""
    _marks.clear()
