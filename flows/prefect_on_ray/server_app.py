"""The app of the run's own Prefect API server process (api_server.py launches it)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from infra.heap import freeze_startup_heap

if TYPE_CHECKING:
    from fastapi import FastAPI


def create_app() -> FastAPI:
    """Prefect's server app, built as Prefect's own `SubprocessASGIServer` builds it, with
    what the build imported frozen out of the garbage collector's full collections: the
    server allocates for every event and log line it records, and each full collection
    would walk the whole of Prefect's server package again (infra/heap.py)."""
    from prefect.server.api.server import create_app as prefect_app

    app = prefect_app()
    freeze_startup_heap()
    return app
