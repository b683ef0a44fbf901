"""A built-in engine server process for a test: launched, healthy, and stopped after."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from infra.engines.launch import launch_engine, stop_engine, wait_until_healthy
from tests.ports import free_port


@contextmanager
def running_engine(model_dir: str, startup_timeout_s: float = 90) -> Iterator[str]:
    """The URL of a built-in server on `model_dir` (seed 0, 1 thread), stopped on exit."""
    port = free_port()
    proc = launch_engine("torch", str(model_dir), "127.0.0.1", port, seed=0, threads=1)
    try:
        wait_until_healthy(f"http://127.0.0.1:{port}", proc, startup_timeout_s)
        yield f"http://127.0.0.1:{port}"
    finally:
        stop_engine(proc)
