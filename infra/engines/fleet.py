"""The engines as the rollout manager uses them, and the recovery of one that fails.

Every request to an engine runs under a watch: while it waits, the engine's `/health` is
probed. An engine whose server has exited (a refused or dropped connection that /health
confirms), or that has not answered /health for `rollout.engine_health_timeout_s`, is
recovered before the request runs again on it:

1. its EngineActor restarts the server process (a new port: the fleet learns the new URL);
2. the weight transport rebuilds the weight-update group over all engines under a fresh
   name and sends them the weights of the last push, labelled with that push's version.

So the restarted engine serves exactly the weights (and version) the dead one held, even
in async mode while the trainer is busy training the next version: the trainer's rank 0
keeps the last push, and the trainer group need not take part. The request then runs
again with the same rids and per-sample seeds (identical samples on the built-in engine);
its first attempt's outputs never reached the batch, so nothing is lost or duplicated.
Only the failed engine's share is redone; the other engines' requests are untouched.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from contextlib import closing
from typing import TypeVar

import ray

from infra.engines.client import HEALTH_TIMEOUT_S, EngineClient, EngineError
from infra.engines.lanes import EngineLanes

log = logging.getLogger(__name__)
T = TypeVar("T")
PROBE_INTERVAL_S = 1.0


class EngineDown(EngineError):
    """An engine's server exited or stopped answering /health."""


class EngineFleet:
    def __init__(
        self,
        urls: list[str],
        request_timeout_s: float,
        health_timeout_s: float,
        max_restarts: int,
        actors: list | None = None,
        transport=None,
        restart_args: tuple = (),
    ):
        self.urls = list(urls)
        self.request_timeout_s = request_timeout_s
        self.health_timeout_s = health_timeout_s
        self.max_restarts = max_restarts if actors else 0  # no actors (tests): nothing to restart
        self.actors = actors or []
        self.transport = transport
        self.restart_args = restart_args
        self.restarts = [0] * len(urls)
        self.recoveries: list[dict] = []  # one record per recovery: engine, URLs, version, timings
        # one client per engine, kept: its connections serve every request and health probe
        # (they close with the manager's process, or once a replaced engine's client is dropped)
        self._clients = [EngineClient(url, request_timeout_s) for url in self.urls]
        self._lock = threading.Lock()  # one recovery at a time: each rebuilds the whole group

    def __len__(self) -> int:
        return len(self.urls)

    def client(self, e: int) -> EngineClient:
        return self._clients[e]

    def call(self, e: int, fn: Callable[[EngineClient], T]) -> T:
        """`fn(client of engine e)`, watched; after a recovery of engine e it runs again."""
        while True:
            generation = self.restarts[e]
            try:
                return self._watched(e, fn)
            except EngineDown as exc:
                self.recover(e, generation, exc)

    def _watched(self, e: int, fn: Callable[[EngineClient], T]) -> T:
        client = self.client(e)
        pool = ThreadPoolExecutor(1)
        future = pool.submit(fn, client)
        pool.shutdown(wait=False)  # a hung request must not hold the caller: its server is killed
        t0 = time.monotonic()
        silent_since: float | None = None
        while True:
            try:
                return future.result(timeout=PROBE_INTERVAL_S)
            except FutureTimeout:
                pass
            except EngineError as exc:
                if exc.status is None and not client.health():  # no answer at all: is it gone?
                    raise EngineDown(f"engine {client.url} died: {exc}") from exc
                raise
            probed = time.monotonic()
            healthy = client.health()
            now = time.monotonic()
            if healthy:
                silent_since = None
            elif silent_since is None:
                silent_since = probed
            if silent_since is not None and now - silent_since > self.health_timeout_s:
                raise EngineDown(
                    f"engine {client.url} hung: no /health answer for {now - silent_since:.0f} s "
                    f"(rollout.engine_health_timeout_s={self.health_timeout_s}) "
                    f"{now - t0:.0f} s into a request"
                )

    def recover(self, e: int, generation: int, cause: EngineError) -> None:
        """Restart engine e and give it the last pushed weights (once, however many callers saw it fail)."""
        with self._lock:
            if self.restarts[e] != generation:
                return  # another request already recovered it
            if self.restarts[e] >= self.max_restarts:
                raise EngineError(
                    f"{cause}; not restarted: {self.restarts[e]} restarts of engine {e} so far "
                    f"(rollout.engine_max_restarts={self.max_restarts})"
                )
            t0 = time.monotonic()
            old = self.urls[e]
            log.warning("engine %d at %s is down (%s): restarting it", e, old, cause)
            self.urls[e] = ray.get(self.actors[e].restart.remote(*self.restart_args))
            # the old client is dropped, not closed: another thread may still watch a request on
            # it, whose failure and health probe must read as the engine's fault (EngineError,
            # False), not as a closed client's RuntimeError that no recovery catches
            self._clients[e] = EngineClient(self.urls[e], self.request_timeout_s)
            t_restart = time.monotonic() - t0
            version = self.transport.restore(list(self.urls), e) if self.transport is not None else None
            self.restarts[e] += 1
            record = {
                "engine": e,
                "old_url": old,
                "new_url": self.urls[e],
                "weight_version": version,
                "cause": str(cause)[:500],
                "time_restart_s": t_restart,
                "time_recover_s": time.monotonic() - t0,
            }
            self.recoveries.append(record)
            log.warning(
                "engine %d back at %s with weight version %s in %.1fs",
                e,
                self.urls[e],
                version,
                record["time_recover_s"],
            )

    def ensure_healthy(self) -> int:
        """Recover every engine that does not answer /health now (before a weight sync); returns how many.

        The probes go out at once, from one event loop: one after another they put a round
        trip per engine on every sync's path (0.1 s at 32 engines, about 1 s at 256,
        bench.scale_sweep), and from a thread per engine they queued for the manager's GIL
        behind whatever else it was doing."""
        generations = list(self.restarts)
        # made for the probes and closed after them (about 2 ms): lanes kept with the fleet
        # would leave their connections to close at the process's end
        with closing(EngineLanes(len(self.urls))) as lanes:

            async def probe(client: EngineClient) -> bool:
                try:
                    await lanes.call(client, "GET", "/health", timeout_s=HEALTH_TIMEOUT_S)
                except EngineError:
                    return False
                return True

            probes = [lanes.submit(e, probe, self.client(e)) for e in range(len(self.urls))]
            down = [e for e, p in enumerate(probes) if not p.result()]
        for e in down:
            url = self.client(e).url
            self.recover(e, generations[e], EngineDown(f"engine {url}: no /health answer"))
        return len(down)
