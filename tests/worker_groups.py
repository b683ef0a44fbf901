"""Which tests share a pytest-xdist worker: `make test` runs two workers, the flow tests one
after another on one of them and every other test beside them on the other (with a few
long flow tests that check no timing).

A flow test runs a Ray cluster, a Prefect flow, trainer ranks and engines on the 2 cores;
two of them at once slow each other and the timing they check. xdist's `--dist loadgroup`
would group them from an `xdist_group` mark, but on pytest 9.2 it silently stops grouping
(pytest-dev/pytest-xdist#1386: it marks a group by renaming node ids, which pytest no longer
reads). So `--dist loadgroup` gets this scheduler instead, through xdist's public hook
`pytest_xdist_make_scheduler`. The one private part is `LoadScopeScheduling._split_scope`,
the method xdist's own loadfile and loadgroup schedulers override to say what one unit of
work is (pytest-xdist>=3.5,<4; tests/unit/test_worker_groups.py checks it).
"""

from __future__ import annotations

import pytest
from xdist.scheduler import LoadScopeScheduling

SERIAL_PREFIXES = ("tests/flows/",)
# Long flow tests that check what a run learns, not how fast: they run beside the serial ones,
# so that both workers end nearer the same time (the flow tests hold most of the suite's time)
BESIDE = ("tests/flows/test_pipeline.py", "tests/flows/test_algorithms_learn.py")


class FlowsOnOneWorker(LoadScopeScheduling):
    """Every test under SERIAL_PREFIXES (but those in BESIDE) is one unit of work; every
    other test is its own."""

    def _split_scope(self, nodeid: str) -> str:
        if nodeid.startswith(BESIDE):
            return nodeid
        for prefix in SERIAL_PREFIXES:
            if nodeid.startswith(prefix):
                return prefix
        return nodeid


def pytest_xdist_make_scheduler(config: pytest.Config, log) -> LoadScopeScheduling | None:
    if config.getvalue("dist") != "loadgroup":
        return None  # xdist's own scheduler for any other --dist
    return FlowsOnOneWorker(config, log)
