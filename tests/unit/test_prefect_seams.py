"""Guards on what the fast Prefect-on-Ray runner (flows/prefect_on_ray) assumes of Prefect and
prefect-ray beyond their public promises.

Each test names one assumption, the module of ours that builds on it, and the versions it
was checked on. A release that breaks one fails here with that message instead of as a
slow, leaking or hanging run (tests/unit/test_private_seams.py does the same for torch, Ray
and transformers). PRL_TASK_RUNNER=stock runs the flow on prefect-ray's own runner, which
needs none of this. Run these before raising the upper bounds in pyproject.toml.
"""

from __future__ import annotations

import hashlib
import inspect
import os
import re
import threading
import tomllib
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from importlib.metadata import version
from pathlib import Path

import pytest

PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"
CHECKED_ON = {"prefect": "3.9.1", "prefect-ray": "0.5.0"}


def _allowed(package: str) -> str:
    """The range pyproject.toml allows for `package`."""
    for requirement in tomllib.loads(PYPROJECT.read_text())["project"]["dependencies"]:
        match = re.fullmatch(rf"{re.escape(package)}([<>=!~].*)", requirement)
        if match:
            return match.group(1)
    return "unbounded"


@contextmanager
def seam(assumption: str, used_in: str, package: str) -> Iterator[None]:
    """Turn a broken expectation into a failure that says what to re-check, where, and on what."""
    try:
        yield
    except (ImportError, AttributeError, TypeError, KeyError, AssertionError) as e:
        pytest.fail(
            f"{package} no longer holds an assumption of {used_in}: {assumption}. Checked on "
            f"{package} {CHECKED_ON[package]} (pyproject allows {_allowed(package)}); installed: "
            f"{package} {version(package)}. {type(e).__name__}: {e}",
            pytrace=False,
        )


def test_the_task_engine_takes_the_client_set_in_sync_client_contexts_var():
    # a Ray worker keeps one open client per settings and makes it current for each task run
    # by setting the context's ContextVar: entering the open one again only counts the entry
    with seam(
        "SyncClientContext.__var__ is the ContextVar that get_or_create (the task engine's way to "
        "its client) reads",
        "flows/prefect_on_ray/context_cache.py (reused_prefect_context)",
        "prefect",
    ):
        from prefect.context import SyncClientContext
        from prefect.task_engine import SyncTaskRunEngine

        kept = object()
        token = SyncClientContext.__var__.set(kept)
        try:
            with SyncClientContext.get_or_create() as current:
                assert current is kept, "get_or_create did not return the context set in __var__"
        finally:
            SyncClientContext.__var__.reset(token)
        engine_start = inspect.getsource(SyncTaskRunEngine.initialize_run)
        assert "SyncClientContext.get_or_create()" in engine_start, (
            "the sync task engine no longer takes its client from SyncClientContext.get_or_create"
        )


def test_only_the_asset_context_of_a_serialized_context_is_the_task_runs_own():
    # the fast runner serializes the rest once per set of current contexts (settings, flow
    # run, parent task run, tags; the deployment's variables are set before a flow run starts)
    with seam(
        "serialize_context(asset_ctx_kwargs) is serialize_context() with the task run's asset "
        "context added, from these keys only",
        "flows/prefect_on_ray/context_cache.py (SerializedContexts)",
        "prefect",
    ):
        from prefect import tags, task
        from prefect.context import AssetContext, serialize_context
        from prefect.settings import PREFECT_TASK_DEFAULT_RETRIES, temporary_settings

        noop = task(name="noop")(lambda: None)
        kw = {"task": noop, "task_run_id": uuid.uuid4(), "task_inputs": {}, "copy_to_child_ctx": True}
        with tags("a-tag"), temporary_settings(updates={PREFECT_TASK_DEFAULT_RETRIES: 2}):
            full = serialize_context(asset_ctx_kwargs=kw)
            shared = serialize_context()
            own = AssetContext.from_task_and_inputs(**kw).serialize()
        assert set(full) == {
            "flow_run_context",
            "task_run_context",
            "tags_context",
            "settings_context",
            "asset_context",
            "deployment_id",
            "deployment_parameters",
        }, sorted(full)
        assert full == {**shared, "asset_context": own}
        assert full["tags_context"]["current_tags"] == {"a-tag"}
        assert full["settings_context"]["settings"]["tasks"]["default_retries"] == 2


def test_a_stopped_queue_service_is_held_only_by_the_exit_hooks_it_registered():
    # a drained (stopped) log or events service stays referenced by its exit hooks; reporting
    # drops them after each drain, or a long-lived worker keeps every stopped one
    with seam(
        "a Prefect queue service registers its exit hooks in threading._threading_atexits and "
        "in the global loop thread's _on_shutdown, and marks itself _stopped when drained",
        "flows/prefect_on_ray/reporting.py (release_stopped_services)",
        "prefect",
    ):
        from prefect._internal.concurrency.services import _QueueServiceBase
        from prefect._internal.concurrency.threads import get_global_loop
        from prefect.logging.handlers import APILogWorker
        from prefect.settings import PREFECT_API_URL, temporary_settings

        from flows.prefect_on_ray.reporting import _stopped_service, release_stopped_services

        # an API that is never called (nothing is queued): none set, Prefect would start one
        with temporary_settings(updates={PREFECT_API_URL: "http://127.0.0.1:9/api"}):
            service = APILogWorker.instance()
            assert isinstance(service, _QueueServiceBase)
            hooks = threading._threading_atexits  # type: ignore[attr-defined]
            assert any(getattr(getattr(h, "func", h), "__self__", None) is service for h in hooks)
            assert any(getattr(c.fn, "__self__", None) is service for c in get_global_loop()._on_shutdown)
            APILogWorker.drain_all(timeout=5)  # nothing queued: it stops
        assert service._stopped is True
        assert release_stopped_services() >= 2
        assert not any(_stopped_service(h) for h in threading._threading_atexits)  # type: ignore[attr-defined]
        assert not any(_stopped_service(c.fn) for c in get_global_loop()._on_shutdown)


def test_the_api_server_app_reads_how_it_was_started_from_the_environment():
    # the run starts Prefect's own server app in a subprocess without importing Prefect's
    # server package, told what it is as Prefect's SubprocessASGIServer tells it
    with seam(
        "uvicorn runs flows.prefect_on_ray.server_app:create_app, which builds Prefect's app with "
        "prefect.server.api.server:create_app; that reads PREFECT__SERVER_EPHEMERAL and "
        "PREFECT__SERVER_FINAL from the environment",
        "flows/prefect_on_ray/api_server.py (ApiServerStart), flows/prefect_on_ray/server_app.py",
        "prefect",
    ):
        from prefect.server.api import server

        assert callable(server.create_app)
        app_source = inspect.getsource(server.create_app)
        for variable in ("PREFECT__SERVER_EPHEMERAL", "PREFECT__SERVER_FINAL"):
            assert f'os.getenv("{variable}")' in app_source, f"create_app no longer reads {variable}"
        launch = inspect.getsource(server.SubprocessASGIServer._run_uvicorn_command)
        for expected in ("PREFECT__SERVER_EPHEMERAL", "PREFECT__SERVER_FINAL", "server:create_app"):
            assert expected in launch, f"Prefect's own server launch no longer uses {expected}"


def test_the_recorder_batch_variables_are_prefect_settings(monkeypatch):
    # a misspelled variable would be ignored without a word: the server records every
    # state in a transaction of its own again
    from flows.prefect_on_ray.api_server import RECORDER_BATCH

    with seam(
        "PREFECT_SERVER_SERVICES_TASK_RUN_RECORDER_* set the task run recorder's batching",
        "flows/prefect_on_ray/api_server.py (RECORDER_BATCH)",
        "prefect",
    ):
        from prefect.settings import Settings

        for key, value in RECORDER_BATCH.items():
            monkeypatch.setitem(os.environ, key, value)
        recorder = Settings().server.services.task_run_recorder
        assert (recorder.batch_size, recorder.flush_interval) == (100, 1)


SOURCES_AS_COPIED = {
    # what the fast runner does in their stead, as read on prefect-ray 0.5.0
    "submit": "fd5a1b4f775ef044",  # FastRayTaskRunner.submit
    "_run_prefect_task": "f41e4875a2e003f8",  # task_body.run_prefect_task
    "_exchange_prefect_for_ray_futures": "a5d5e949d672a521",  # FastRayTaskRunner._to_ray
}


@pytest.mark.parametrize("name", sorted(SOURCES_AS_COPIED))
def test_prefect_ray_runs_a_task_run_as_the_fast_runner_copied_it(name):
    # not a private API the runner calls (it calls none): a change in what prefect-ray submits
    # or runs for a task run (a new context, another engine call) is one to copy
    with seam(
        f"RayTaskRunner.{name} is the code the fast runner's copy was made from",
        "flows/prefect_on_ray/runner.py and task_body.py",
        "prefect-ray",
    ):
        from prefect_ray import RayTaskRunner

        source = inspect.getsource(getattr(RayTaskRunner, name)).encode()
        assert hashlib.sha256(source).hexdigest()[:16] == SOURCES_AS_COPIED[name], (
            f"RayTaskRunner.{name} changed: compare it with the fast runner's copy"
        )
