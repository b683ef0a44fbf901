"""Calls to many engines at once from one event-loop thread: each engine's calls in order.

A weight sync makes five calls to every engine (pause, session begin, the bucket's request,
session end, resume). Made from a thread per engine through httpx, 32 engines cost the
calling process 126 ms of CPU a sync, the threads taking turns on the GIL; from one asyncio
loop through aiohttp, 26 ms (`python -m bench.weight_fanout`, 2 cores). The sync runs on
trainer rank 0 between the end of one generation and the start of the next, so that cost is
on every iteration's critical path, and it grows with the number of engines.

A lane is one engine's queue: `submit(lane, fn, ...)` runs the coroutine function `fn` once
everything submitted to that lane before has ended (however it ended), and returns a
`concurrent.futures.Future` the calling thread may wait on. Lanes run beside each other.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable, Mapping
from concurrent.futures import Future
from contextlib import suppress
from typing import Any, TypeVar

import aiohttp

from infra.engines.client import (
    KEEPALIVE_S,
    EngineClient,
    EngineError,
    reply_data,
    request_content,
    request_headers,
    tls_context,
)

T = TypeVar("T")
CLOSE_TIMEOUT_S = 10.0


class EngineLanes:
    def __init__(self, lanes: int) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="engine-lanes", daemon=True)
        self._thread.start()
        self._lock = threading.Lock()  # submissions to one lane keep the order of their callers
        self._tails: list[Future | None] = [None] * lanes
        self._http = asyncio.run_coroutine_threadsafe(self._open(), self._loop).result()

    @staticmethod
    async def _open() -> aiohttp.ClientSession:
        # no connection limit: every engine gets its call at once. Idle connections close
        # before the servers' own keep-alive ends (see KEEPALIVE_S)
        connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=KEEPALIVE_S, ssl=tls_context())
        return aiohttp.ClientSession(connector=connector)

    def submit(self, lane: int, fn: Callable[..., Awaitable[T]], *args: Any) -> Future[T]:
        """Run `fn(*args)` on the loop after the lane's earlier calls; its future."""
        with self._lock:
            after = self._tails[lane]
            future = asyncio.run_coroutine_threadsafe(self._after(after, fn, args), self._loop)
            self._tails[lane] = future
        return future

    @staticmethod
    async def _after(previous: Future | None, fn: Callable[..., Awaitable[T]], args: tuple) -> T:
        if previous is not None:
            # only its end matters here: its outcome is for whoever submitted it. The loop's
            # copy of that outcome is read all the same, or a failure would be logged again
            # when the copy is collected (from inside whatever the collection interrupted)
            ended = asyncio.wrap_future(previous)
            await asyncio.wait([ended])
            if not ended.cancelled():
                ended.exception()
        return await fn(*args)

    async def call(
        self,
        client: EngineClient,
        method: str,
        path: str,
        body: dict | None = None,
        timeout_s: float | None = None,
    ) -> tuple[Any, Mapping[str, str]]:
        """One request to `client`'s engine, on the loop: the decoded reply and its headers;
        an EngineError as `EngineClient` raises it (the same timeout unless `timeout_s`, the
        same headers and checks)."""
        where = f"{client.url}{path}"
        try:
            async with self._http.request(
                method,
                where,
                data=request_content(body),
                headers=request_headers(body),
                timeout=aiohttp.ClientTimeout(total=timeout_s or client.timeout_s),
            ) as resp:
                content = await resp.read()
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise EngineError(f"{where}: {type(exc).__name__}: {exc}") from exc
        return reply_data(where, resp.status, content), resp.headers

    def close(self) -> None:
        """Cancel what is still queued or running, close the connections, stop the loop."""
        if self._loop.is_closed():
            return
        try:
            closing = asyncio.run_coroutine_threadsafe(self._shutdown(), self._loop)
            with suppress(TimeoutError):  # the loop stops below all the same
                closing.result(timeout=CLOSE_TIMEOUT_S)
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=CLOSE_TIMEOUT_S)
            if not self._thread.is_alive():
                self._loop.close()

    async def _shutdown(self) -> None:
        current = asyncio.current_task()
        for task in asyncio.all_tasks():
            if task is not current:
                task.cancel()
        await self._http.close()
