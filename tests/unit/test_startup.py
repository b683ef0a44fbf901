"""The start-up timeline: marks in seconds since the process was created."""

from __future__ import annotations

import subprocess
import sys
import time

from infra import startup


def test_process_start_is_when_the_command_ran() -> None:
    # a child process's start, read by itself, falls between the launch and its answer
    before = time.time()
    out = subprocess.check_output(
        [sys.executable, "-c", "from infra import startup; print(startup.PROCESS_START_UNIX)"]
    )
    after = time.time()
    assert before - 0.02 <= float(out) <= after


def test_marks_are_seconds_since_the_process_started_in_time_order() -> None:
    startup.reset()
    try:
        t0 = startup.PROCESS_START_UNIX
        startup.mark("late", at=t0 + 0.5)
        startup.mark("early", at=t0 + 0.25)
        startup.mark("early", at=t0 + 0.75)  # a repeated phase keeps its first mark
        startup.mark("now")
        line = startup.timeline()
        assert list(line) == ["early", "late", "now"]
        assert line["early"] == 0.25 and line["late"] == 0.5
        assert line["now"] == round(startup.marks_unix()["now"] - t0, 3) > 0.5
    finally:
        startup.reset()
