"""Long-lived Ray actors that run the flow's control work (its Prefect task runs), one piece
at a time, in the order the flow submitted it.

The loop's critical path is a chain: train k, then the weight sync, then train k+1, each
waiting for the one before. As Ray tasks, every link would go through the flow's process:
the upstream's worker would return its result there, the downstream's arguments would be
resolved there, and a worker would be leased for it from the raylet before it could start
(a timeline of the demo: 6-8 ms a link on 2 busy cores, twice an iteration). An actor runs what one
caller sent it in the order it was sent, so a task run queued behind the one it waits for
is already on that worker, and starts when the worker is done with the one before.

`ControlWorkers.pick` keeps such chains on one worker: work that waits for the last thing
sent to a worker goes to that worker, anything else to an idle one (a new worker is
started when none is). Which of the awaited refs ran before it on the same worker is part
of the answer, so the caller need not have Ray wait for those (what they left behind is in
that worker's process). No Prefect here: the flow's task runner (flows/prefect_on_ray) is the user.

A worker that dies takes the work queued on it along (no restarts, no retries): its refs
raise Ray's RayActorError where they are read, so the flow run fails there and is resumed
like any failed run. Ray would retry a plain task on another worker; a control step (an
optimizer step) is not something to run twice unseen.
"""

from __future__ import annotations

import importlib
import logging
import os
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import ray

from infra.cluster.ray_cluster import CONTROL_RUNTIME_ENV
from infra.heap import freeze_startup_heap

log = logging.getLogger(__name__)

# What the control work runs with: no CPU reserved (it only waits on actors, so it must not
# queue behind them) and its own runtime env (flows/run_start.py enters these as remote options)
CONTROL_OPTIONS: dict[str, Any] = {"num_cpus": 0, "runtime_env": CONTROL_RUNTIME_ENV}
# The work sent last to a worker that later work may count as ran before it; the worker keeps
# the final states of as many task runs (flows/prefect_on_ray/task_body.py). Anything older
# goes to Ray to wait for.
RECENT_PER_WORKER = 16


class ControlWorker:
    """One process running control work sequentially (Ray actor, `max_concurrency=1`)."""

    def __init__(self, modules: list[str]) -> None:
        for name in modules:  # imported before the first call: the loop's first iterations are not slowed
            importlib.import_module(name)
        freeze_startup_heap()  # Prefect's and the code's modules, alive as long as the worker

    def pid(self) -> int:
        return os.getpid()

    def run(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        return fn(*args, **kwargs)


_ControlWorker = ray.remote(ControlWorker)


@dataclass
class _Worker:
    handle: ray.actor.ActorHandle
    # what was sent to it last, in order: it runs them in this order
    recent: deque[ray.ObjectRef] = field(default_factory=lambda: deque(maxlen=RECENT_PER_WORKER))

    @property
    def last(self) -> ray.ObjectRef | None:
        return self.recent[-1] if self.recent else None


class ControlWorkers:
    """A pool of ControlWorker actors and which of them ran what (driver side)."""

    def __init__(self, modules: list[str], options: dict[str, Any] | None = None) -> None:
        self.modules = list(modules)
        self.options = dict(CONTROL_OPTIONS if options is None else options)
        self.workers: list[_Worker] = []

    def start(self, count: int) -> list[ray.ObjectRef]:
        """Start `count` workers now (they import the modules meanwhile); refs of their pids."""
        return [self._new().handle.pid.remote() for _ in range(count)]

    def serves(self, options: dict[str, Any]) -> bool:
        """Is work with these Ray options (resources, runtime env) for these workers?"""
        return options == self.options

    def pick(self, after: list[ray.ObjectRef]) -> tuple[_Worker, list[ray.ObjectRef]]:
        """The worker for work that waits for every ref in `after`, and those of `after` that
        it ran (or will run) before that work: ordering alone makes the work wait for them.
        The caller has Ray wait for the others (as arguments of the call it `send`s)."""
        worker = self._pick(after)
        return worker, [ref for ref in after if ref in worker.recent]

    def send(
        self, worker: _Worker, fn: Callable[..., Any], *args: Any, name: str | None = None, **kwargs: Any
    ) -> ray.ObjectRef:
        """Queue `fn(*args, **kwargs)` on `worker` (from `pick`); its ref."""
        method = worker.handle.run if name is None else worker.handle.run.options(name=name)
        ref = method.remote(fn, *args, **kwargs)
        worker.recent.append(ref)
        return ref

    def _pick(self, after: list[ray.ObjectRef]) -> _Worker:
        # behind the last thing a worker was sent, if this waits for it anyway (a chain)
        for ref in after:
            for worker in self.workers:
                if worker.last == ref:
                    return worker
        # else a worker with nothing left to run (waiting behind unrelated work would delay it)
        for worker in self.workers:
            if worker.last is None or ray.wait([worker.last], timeout=0, fetch_local=False)[0]:
                return worker
        log.info("control workers: all %d busy, starting one more", len(self.workers))
        return self._new()

    def _new(self) -> _Worker:
        actor = _ControlWorker.options(**self.options, max_restarts=0, max_concurrency=1)
        worker = _Worker(actor.remote(self.modules))
        self.workers.append(worker)
        return worker

    def close(self) -> None:
        """Stop every worker (what they ran has been read or is lost with them)."""
        for worker in self.workers:
            try:
                ray.kill(worker.handle)
            except Exception as e:  # noqa: BLE001 - Ray may be gone, or the worker dead already
                log.debug("control worker kill failed: %s", e)
        self.workers = []


# The pool of the run this process drives (RLSystem opens and closes it); the flow's task
# runner sends its task runs there. One run per process, as one Ray connection per process.
_current: ControlWorkers | None = None


def open_pool(modules: list[str], count: int) -> tuple[ControlWorkers, list[ray.ObjectRef]]:
    """Start this process's pool of `count` control workers; the refs say when they are up."""
    global _current
    if _current is not None:
        _current.close()
    _current = ControlWorkers(modules)
    return _current, _current.start(count)


def close_pool(pool: ControlWorkers) -> None:
    global _current
    pool.close()
    if _current is pool:
        _current = None


def current_pool() -> ControlWorkers | None:
    return _current
