"""An asyncio event loop running in a daemon thread, for tests that serve simulated engines
(bench/sim_engine.py) while the code under test calls them synchronously."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Iterator


@contextlib.contextmanager
def background_loop() -> Iterator[asyncio.AbstractEventLoop]:
    loop = asyncio.new_event_loop()
    threading.Thread(target=loop.run_forever, daemon=True).start()
    try:
        yield loop
    finally:
        loop.call_soon_threadsafe(loop.stop)
