"""Guards of the built-in engine server: the per-run API key, and the generation progress
that /health reports (see infra/rollout/server.py)."""

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


class BeatingFlag:
    """The abort flag as the decode loop sees it: each check (once per step) is a heartbeat."""

    def __init__(self, flag: threading.Event, progress: Progress) -> None:
        self.flag, self.progress = flag, progress

    def is_set(self) -> bool:
        self.progress.beat()
        return self.flag.is_set()


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
