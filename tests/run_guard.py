"""What a test run shows when it is cut off: each failure as it happens, and a stack dump
before a stuck test holds the whole run.

CI stops a run at its time limit and keeps only what was printed by then; pytest prints the
reasons for failures in its summary at the end, which such a run never reaches. So a failure
is also printed the moment its report comes in.

pytest-timeout (`timeout` in pyproject) fails a test from a SIGALRM handler, which Python runs
only between bytecodes: a test blocked inside a C call (a collective, a store wait) outlives
it. If a test is still running at 1.5 times its timeout, faulthandler dumps every thread's
stack and ends the run, so one stuck test costs minutes, not the rest of CI's time.
"""

from __future__ import annotations

import faulthandler
import os
from collections.abc import Iterator

import pytest

WATCHDOG_FACTOR = 1.5


class RunGuard:
    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        # faulthandler writes to a descriptor, and while a test runs pytest's capture has
        # redirected descriptor 2; a copy taken now still reaches the real stderr
        self.stderr_fd = os.dup(2)

    def timeout_s(self, item: pytest.Item) -> float:
        marker = item.get_closest_marker("timeout")
        if marker is not None and (marker.args or "timeout" in marker.kwargs):
            return float(marker.args[0] if marker.args else marker.kwargs["timeout"])
        return float(self.config.getini("timeout") or 0)

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item: pytest.Item) -> Iterator[None]:
        timeout_s = self.timeout_s(item)
        if timeout_s > 0:
            faulthandler.dump_traceback_later(timeout_s * WATCHDOG_FACTOR, exit=True, file=self.stderr_fd)
        try:
            yield
        finally:
            faulthandler.cancel_dump_traceback_later()

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        reporter = self.config.pluginmanager.get_plugin("terminalreporter")
        if not report.failed or reporter is None:
            return
        reporter.ensure_newline()
        reporter.write_sep("_", f"{report.nodeid} failed in {report.when}", red=True)
        reporter.write_line(report.longreprtext)

    def pytest_unconfigure(self) -> None:
        os.close(self.stderr_fd)


def pytest_configure(config: pytest.Config) -> None:
    config.pluginmanager.register(RunGuard(config), "run_guard")
