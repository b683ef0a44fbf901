import os
from collections.abc import Iterator
from contextlib import contextmanager

import psutil
import pytest
import ray
from prefect.testing.utilities import prefect_test_harness

from flows.prefect_on_ray import worker_env
from infra.cluster.ray_cluster import runtime_env

XDIST_WORKER_ENV = "PYTEST_XDIST_WORKER"


@pytest.fixture(scope="session")
def prefect_api():
    """A real Prefect API server (subprocess on loopback, temporary database)."""
    # no network here: the server must not try to send usage telemetry
    os.environ["PREFECT_SERVER_ANALYTICS_ENABLED"] = "false"
    with prefect_test_harness(server_startup_timeout=120):
        from prefect.settings import PREFECT_API_URL

        yield PREFECT_API_URL.value()


@contextmanager
def ray_workers(**env: str) -> Iterator[dict]:
    """A local Ray whose workers report to the test API, with `env` on top."""
    env = {**worker_env(), **env}
    # secrets reach the workers as in a run: never through env_vars, which Ray logs
    ray.init(num_cpus=1, include_dashboard=False, runtime_env=runtime_env("", env))
    try:
        yield env
    finally:
        ray.shutdown()  # kills the worker: anything it had not sent is gone


@pytest.fixture
def prefect_log_batches(prefect_api):
    with ray_workers() as env:  # Prefect's own batch interval
        yield env


@pytest.fixture
def slow_log_batches(prefect_api):
    with ray_workers(PREFECT_LOGGING_TO_API_BATCH_INTERVAL="60") as env:
        yield env


def engine_server_pids() -> list[int]:
    """Engine servers still running anywhere on this machine (there must be none after a run)."""
    pids = []
    for p in psutil.process_iter(["pid", "cmdline"]):
        cmd = " ".join(p.info["cmdline"] or [])
        if "infra.engine_server.server" in cmd and _same_worker(p):
            pids.append(p.info["pid"])
    return pids


def _same_worker(p: psutil.Process) -> bool:
    """Whether `p` descends from this pytest worker: tests run in parallel (`pytest -n`)
    start engine servers of their own, and the environment survives re-parenting."""
    try:
        return p.environ().get(XDIST_WORKER_ENV) == os.environ.get(XDIST_WORKER_ENV)
    except psutil.Error:
        return False  # gone, or another user's
