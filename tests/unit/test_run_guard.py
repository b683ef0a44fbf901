"""tests/run_guard.py in a pytest run of its own: a failure is printed before the run ends,
and a test blocked where pytest-timeout's signal cannot reach it ends the run with every
thread's stack instead of holding it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

INNER_TESTS = """
import signal
import time

import pytest


def test_fails_first():
    assert "early" == "late"


@pytest.mark.timeout(1)
def test_blocked_past_its_timeout():
    signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGALRM])  # as a C call that never returns
    time.sleep(60)


def test_never_reached():
    pass
"""


def test_a_failure_shows_at_once_and_a_blocked_test_ends_the_run(tmp_path: Path) -> None:
    (tmp_path / "test_inner.py").write_text(INNER_TESTS)
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "tests.run_guard",
            "-p",
            "no:cacheprovider",
            "-v",
            str(tmp_path),
        ],
        cwd=tmp_path,
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=50,
    )
    out = run.stdout + run.stderr
    assert run.returncode != 0
    assert "test_fails_first failed in call" in out
    assert "AssertionError" in out.split("test_fails_first failed in call")[1]
    assert "short test summary" not in out  # the run never reached its end...
    assert "Timeout" in out and "in test_blocked_past_its_timeout" in out  # ...it dumped the stack
    assert "test_never_reached PASSED" not in out
