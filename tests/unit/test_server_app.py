"""The run's Prefect API server app: Prefect's own, its imports frozen out of the collector."""

import gc

from fastapi import FastAPI

from flows.prefect_on_ray.server_app import create_app


def test_the_app_is_prefects_and_the_heap_is_frozen_once_it_is_built():
    gc.unfreeze()
    try:
        app = create_app()
        assert isinstance(app, FastAPI)
        assert "/api" in {getattr(r, "path", "") for r in app.routes}  # the API, mounted
        assert gc.get_freeze_count() > 10_000  # Prefect's server package, among the rest
    finally:
        gc.unfreeze()
