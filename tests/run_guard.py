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

import pytest

WATCHDOG_FACTOR = 1.5


class RunGuard:
    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        # faulthandler writes to a descriptor, and while a test runs pytest's capture has
        # redirected descriptor 2; a copy taken now still reaches the real stderr
        self.stderr_fd = os.dup(2)

    # pytest-timeout's own hooks, called with the timeout it resolved for the test (marker,
    # --timeout, PYTEST_TIMEOUT, ini) when it sets and cancels its timer; returning None lets
    # its own timer be set and cancelled after these
    @pytest.hookimpl(tryfirst=True)
    def pytest_timeout_set_timer(self, item: pytest.Item, settings) -> None:
        faulthandler.dump_traceback_later(settings.timeout * WATCHDOG_FACTOR, exit=True, file=self.stderr_fd)

    @pytest.hookimpl(tryfirst=True)
    def pytest_timeout_cancel_timer(self, item: pytest.Item) -> None:
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
