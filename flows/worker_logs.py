"""Send a task run's logs from its Ray worker before the result returns, without leaking.

Prefect's way (`APILogHandler().flush()`) drains and stops *every* Prefect queue service of
the process (they share one registry): the log worker and the events worker with its
websocket. The next task run starts new ones, and each stopped service stays referenced by
the exit hooks it registered when it started (threading's pre-shutdown hooks, the global
event loop's shutdown calls), so a long-lived Ray worker kept every one of them: each
worker running the loop's task runs grew by ~0.5 GB over 175 iterations of an 8 x 8 x 4
run (bench/memory_growth.py, 2 task runs per worker per iteration). After the drain, the
hooks of the stopped services are dropped; the running ones keep theirs.
"""

from __future__ import annotations

import threading

from prefect._internal.concurrency.services import _QueueServiceBase
from prefect._internal.concurrency.threads import get_global_loop
from prefect.logging.handlers import APILogHandler


def _stopped_service(fn: object) -> bool:
    """Is fn a bound method (or a partial of one) of a stopped Prefect queue service?"""
    fn = getattr(fn, "func", fn)  # threading wraps its hooks in functools.partial
    owner = getattr(fn, "__self__", None)
    return isinstance(owner, _QueueServiceBase) and owner._stopped


def release_stopped_services() -> int:
    """Drop the exit hooks of stopped queue services (nothing is left for them to do: a
    drain already waited on their work); returns how many hooks went."""
    hooks = threading._threading_atexits  # type: ignore[attr-defined]
    kept = [h for h in hooks if not _stopped_service(h)]
    dropped = len(hooks) - len(kept)
    hooks[:] = kept
    loop = get_global_loop()
    calls = [c for c in loop._on_shutdown if not _stopped_service(c.fn)]
    dropped += len(loop._on_shutdown) - len(calls)
    loop._on_shutdown = calls
    return dropped


def flush_task_logs() -> None:
    """Logs (and events) of the task run sent now; the services it stopped can be freed."""
    try:
        APILogHandler().flush()
    finally:
        release_stopped_services()
