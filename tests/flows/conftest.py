import os

import psutil
import pytest
from prefect.testing.utilities import prefect_test_harness


@pytest.fixture(scope="session")
def prefect_api():
    """A real Prefect API server (subprocess on loopback, temporary database)."""
    # no network here: the server must not try to send usage telemetry
    os.environ["PREFECT_SERVER_ANALYTICS_ENABLED"] = "false"
    with prefect_test_harness(server_startup_timeout=120):
        from prefect.settings import PREFECT_API_URL

        yield PREFECT_API_URL.value()


def engine_server_pids() -> list[int]:
    """Engine servers still running anywhere on this machine (there must be none after a run)."""
    pids = []
    for p in psutil.process_iter(["pid", "cmdline"]):
        cmd = " ".join(p.info["cmdline"] or [])
        if "infra.rollout.server" in cmd:
            pids.append(p.info["pid"])
    return pids
