"""Getting a task run's logs and states to the Prefect API without waiting for them.

A task run on a Ray worker reports through two background services of Prefect's: logs in
batches (every `PREFECT_LOGGING_TO_API_BATCH_INTERVAL`, 2 s by default) and state changes
as events. Ray kills its workers at shutdown without running exit hooks, so whatever a
worker has not sent by then is lost: the UI would show the last task runs Running forever,
without their logs.

- A completed task run returns at once and its worker's services keep running: its logs
  go with the next batch, its states as events. Stopping (draining) the services after
  every task run, to send at once, would make the next task run start them again with two new
  API clients; each one builds an SSL context from the CA bundle, and a profile of the demo
  loop's workers found that the largest part of their CPU.
- A task run that did not complete drains before it returns, so a failure's traceback and
  logs are in the UI even if the run ends right after.
- Before Ray goes down, the flow waits until the API holds the final state and the closing
  "Finished in state" log of every task run it submitted last (`wait_reported`).

Draining stops *every* Prefect queue service of the process (they share one registry): the
log worker and the events worker with its websocket. A stopped service stays referenced by
the exit hooks it registered when it started (threading's pre-shutdown hooks, the global
event loop's shutdown calls), so a long-lived Ray worker kept every one of them: about 2 MB
per drain (bench/memory_growth.py). After each drain the stopped services' hooks are
dropped (`release_stopped_services`); this reads private attributes of `threading` and of
Prefect, which tests/unit/test_prefect_seams.py checks still hold.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable
from uuid import UUID

from prefect._internal.concurrency.services import _QueueServiceBase
from prefect._internal.concurrency.threads import get_global_loop
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import (
    LogFilter,
    LogFilterTaskRunId,
    LogFilterTextSearch,
    TaskRunFilter,
    TaskRunFilterId,
)
from prefect.logging.handlers import APILogWorker
from prefect.settings import PREFECT_LOGGING_TO_API_ENABLED

from infra.retry import poll

log = logging.getLogger(__name__)
# Prefect's task engine logs this last, after the final state is set
FINISHED = "Finished in state"


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


def _drain(timeout_s: float) -> None:
    """Send what every Prefect queue service of the process holds (they share one registry:
    the log and the events workers), stop them, and free the stopped ones."""
    try:
        APILogWorker.drain_all(timeout=timeout_s)
    finally:
        release_stopped_services()


def send_reports_now() -> None:
    """Send everything this worker has queued (logs and events) and wait for it."""
    _drain(timeout_s=5)  # what APILogHandler().flush() allows from a thread without a loop


def _logs_enabled() -> bool:
    return bool(PREFECT_LOGGING_TO_API_ENABLED.value()) and logging.getLogger(
        "prefect.task_runs"
    ).isEnabledFor(logging.INFO)


def _unreported(client, ids: list[UUID], want_logs: bool) -> list[UUID]:
    runs = client.read_task_runs(task_run_filter=TaskRunFilter(id=TaskRunFilterId(any_=ids)), limit=len(ids))
    final = {r.id for r in runs if r.state is not None and r.state.is_final()}
    if not want_logs:
        return [i for i in ids if i not in final]
    closing = LogFilter(
        task_run_id=LogFilterTaskRunId(any_=ids), text=LogFilterTextSearch(query=f'"{FINISHED}"')
    )
    logs = client.read_logs(log_filter=closing, limit=4 * len(ids))
    closed = {entry.task_run_id for entry in logs if entry.message.startswith(FINISHED)}
    return [i for i in ids if i not in final or i not in closed]


def wait_reported(task_run_ids: Iterable[UUID], timeout_s: float = 30.0) -> list[UUID]:
    """Wait until the API holds the final state (and, with logs to the API on, the closing
    log) of every given task run; the ids still missing after `timeout_s` (warned)."""
    ids = list(dict.fromkeys(task_run_ids))
    want_logs = _logs_enabled()
    with get_client(sync_client=True) as client:

        def reported() -> bool:
            nonlocal ids
            ids = _unreported(client, ids, want_logs)
            return not ids

        if ids:
            poll(reported, timeout_s)
    if ids:
        log.warning("%d task runs not fully reported to the API after %.0f s: %s", len(ids), timeout_s, ids)
    return ids
