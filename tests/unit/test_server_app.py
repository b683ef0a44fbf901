"""The run's Prefect API server app: Prefect's own, its imports frozen out of the collector."""

import subprocess
import sys

# In a process of its own, as the server runs: Prefect's server package imported into the
# test session would stay there and slow every later test's garbage collections.
CHECK = """
import gc
from fastapi import FastAPI
from flows.prefect_on_ray.server_app import create_app
app = create_app()
print(isinstance(app, FastAPI), "/api" in {getattr(r, "path", "") for r in app.routes}, gc.get_freeze_count())
"""


def test_the_app_is_prefects_and_the_heap_is_frozen_once_it_is_built():
    out = subprocess.run(
        [sys.executable, "-c", CHECK], capture_output=True, text=True, timeout=120, check=True
    )
    is_app, mounted, frozen = out.stdout.split()
    assert is_app == "True" and mounted == "True"  # the API, mounted as Prefect mounts it
    assert int(frozen) > 10_000  # Prefect's server package, among the rest
