"""Guards of the built-in engine server: the per-run API key, the request body size, and
the generation progress that /health reports (see infra/engine_server/server.py)."""

from __future__ import annotations

import hmac
import threading
import time

from fastapi.responses import JSONResponse

# Paths a health probe reaches without the key (as in SGLang).
_OPEN_PATHS = ("/health", "/health_generate")


class Progress:
    """When generation last moved: a decode step, or the end of a batch. /health reads it."""

    def __init__(self) -> None:
        self.active = 0
        self.last = time.monotonic()
        self.lock = threading.Lock()

    def beat(self) -> None:
        self.last = time.monotonic()

    def stalled_for(self) -> float:
        return time.monotonic() - self.last if self.active else 0.0


class RowAborts:
    """The abort flags of one request's sampled rows: raised by /abort_request (by rid) or
    when the client hangs up, read by the decode loop once per step. Each read is a
    heartbeat for /health. Plain booleans, not an Event per row: a 1024-row request made and
    polled 1024 Events (~4 ms of a ~90 ms one-token request)."""

    def __init__(self, rows: int, progress: Progress | None = None) -> None:
        self.flags = [False] * rows
        self.raised = False  # any flag set: until then a read builds no list of flags
        self.progress = progress

    def set(self, row: int | None = None) -> None:
        """Abort `row`, or every row."""
        if row is None:
            self.flags = [True] * len(self.flags)
        else:
            self.flags[row] = True
        self.raised = True

    def read(self, rows: list[int]) -> list[bool]:
        """The flags of `rows`, in order."""
        if self.progress is not None:
            self.progress.beat()
        if not self.raised:
            return [False] * len(rows)
        flags = self.flags
        return [flags[i] for i in rows]


class RequireKey:
    """Plain ASGI middleware (Starlette's BaseHTTPMiddleware would hide client disconnects
    from the handlers): every path but the health probes needs `Authorization: Bearer <key>`."""

    def __init__(self, app, api_key: str) -> None:
        self.app, self.expected = app, f"Bearer {api_key}".encode()

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http" and scope["path"] not in _OPEN_PATHS:
            given = dict(scope["headers"]).get(b"authorization", b"")
            if not hmac.compare_digest(given, self.expected):
                message = "unauthorized: this engine needs its run's API key (Authorization: Bearer)"
                await JSONResponse({"success": False, "message": message}, status_code=401)(
                    scope, receive, send
                )
                return
        await self.app(scope, receive, send)


class BodyLimit:
    """Plain ASGI middleware: a request body over `max_bytes` gets 413 before anything parses
    it (JSON decoding and validation run on the event loop, where /health answers too).

    A body declared too large by Content-Length is refused unread; a chunked one is counted
    as it arrives. The rest of a refused body is read and dropped, up to `drain_bytes`, so
    the client, still sending, receives the 413 instead of a reset connection.
    """

    def __init__(self, app, max_bytes: int, drain_bytes: int = 256 * 2**20) -> None:
        self.app, self.max_bytes, self.drain_bytes = app, max_bytes, drain_bytes

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and declared.isdigit():
            if int(declared) > self.max_bytes:
                await self._refuse(f"{int(declared)} bytes", scope, receive, send)
                return
            await self.app(scope, receive, send)
            return
        # no length given: buffer the body (at most max_bytes) and replay it to the app
        messages, size = [], 0
        while True:
            message = await receive()
            messages.append(message)
            if message["type"] != "http.request":
                break
            size += len(message.get("body", b""))
            more = message.get("more_body", False)
            if size > self.max_bytes:
                await self._refuse(f"more than {self.max_bytes} bytes", scope, receive, send, more)
                return
            if not more:
                break

        async def replay():
            return messages.pop(0) if messages else await receive()

        await self.app(scope, replay, send)

    async def _refuse(self, size: str, scope, receive, send, more: bool = True) -> None:
        drained = 0
        while more and drained < self.drain_bytes:
            message = await receive()
            if message["type"] != "http.request":
                break
            drained += len(message.get("body", b""))
            more = message.get("more_body", False)
        message = f"request body: {size} exceed the engine's limit of {self.max_bytes} (--max-request-mb)"
        await JSONResponse({"success": False, "message": message}, status_code=413)(scope, receive, send)
