"""Prefect's per-task-run context work, done once per process instead.

Worker side: prefect-ray rebuilds Prefect's context for every task run: the flow run's settings are
validated again from a dict and the environment (pydantic-settings, dozens of nested
models), and a new API client is made (an httpx client and an SSL context that loads the
CA bundle). A cProfile of a Ray worker running trivial tasks spent most of each task run
there. A worker runs one task at a time and every task run of a flow run carries the same
settings, so both are made once per process and kept while the settings stay the same.
Prefect's task engine takes the current client from `SyncClientContext`; the kept one, already
open, is made current through the context's ContextVar (`SyncClientContext.__var__`): entering
it again would only count the entry. A private seam (tests/unit/test_prefect_seams.py).

Flow side: every submit serializes the flow's settings and its flow run context for the
worker (model_dumps of every settings model, of the flow run, the flow and its parameters:
~0.1 s on a busy 2-core machine, in the flow loop's own thread). Neither context changes
during a flow run (Prefect changes them by entering new ones), so that part of the
serialized context is kept (`SerializedContexts`). The flow run context also goes to Ray's
object store once (~55 KB pickled: the flow object and its parameter schema); task runs
carry a reference to it, and each worker unpickles it once.

A flow that a deployment runs is loaded from its file by path: Prefect imports it as a
top-level module named after the file (`flows/train.py` becomes `train`), which no Ray
worker can import. The flow object in the flow run context would then reach the workers as
a reference to that module and fail there ("No module named 'train'"), so such a module
travels by value (`_flow_module_by_value`).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import ray
import ray.cloudpickle
from prefect.context import (
    AssetContext,
    EngineContext,
    SettingsContext,
    SyncClientContext,
    TagsContext,
    TaskRunContext,
    serialize_context,
)

from flows.prefect_on_ray.object_store import GetOnce, PutOnce

# serialized settings -> (their context, a client opened under them); one flow run at a time
_cache: dict[str, tuple[SettingsContext, SyncClientContext]] = {}


class SerializedContexts:
    """Flow side: Prefect's `serialize_context` for a task run, its flow run's part made once.

    Of what it serializes only the asset context is the task run's own; the settings, the flow
    run, the parent task run, the tags and the deployment are the flow run's. Prefect changes
    those by entering new contexts, never by editing one in place, so that part is kept per
    set of current contexts (by identity, the objects kept alive so an id stays its own). The
    same flow run context keeps the same serialized object across such sets (other settings
    entered for a while): it goes to Ray's object store once per object (`store_flow_run_context`)."""

    def __init__(self, keep: int = 4) -> None:
        self.keep = keep  # a few recent ones: each entry holds its contexts alive
        self.kept: dict[tuple, tuple[tuple, dict[str, Any]]] = {}
        self.flow_runs: dict[int, tuple[object, dict[str, Any]]] = {}

    def __call__(self, asset_ctx_kwargs: dict[str, Any]) -> dict[str, Any]:
        current = (EngineContext.get(), TaskRunContext.get(), SettingsContext.get())
        # TagsContext.get() makes a new empty one whenever none is entered: keyed by its tags
        key = (*(id(c) for c in current), frozenset(TagsContext.get().current_tags))
        hit = self.kept.get(key)
        if hit is None or any(a is not b for a, b in zip(hit[0], current, strict=True)):
            if len(self.kept) >= self.keep:
                self.kept.clear()
            serialized = serialize_context()
            serialized["flow_run_context"] = self._flow_run(current[0], serialized["flow_run_context"])
            hit = self.kept[key] = (current, serialized)
        asset = AssetContext.from_task_and_inputs(**asset_ctx_kwargs).serialize()
        return {**hit[1], "asset_context": asset}

    def _flow_run(self, context: object, serialized: dict[str, Any]) -> dict[str, Any]:
        """The serialized flow run context made first for `context`."""
        hit = self.flow_runs.get(id(context))
        if hit is None or hit[0] is not context:
            if len(self.flow_runs) >= self.keep:
                self.flow_runs.clear()
            hit = self.flow_runs[id(context)] = (context, serialized)
        return hit[1]


class _Stored:
    """A task run's serialized flow run context, kept in Ray's object store: the reference
    travels with the task run, not the ~55 KB it points to."""

    def __init__(self, ref: ray.ObjectRef) -> None:
        self.ref = ref


# flow side: serialized flow run context -> its object-store copy; worker side: ref -> it
_stored = PutOnce()
_loaded = GetOnce()


def store_flow_run_context(context: dict[str, Any]) -> dict[str, Any]:
    """Flow side: `context` (prefect's serialize_context) with its flow run part replaced by
    a reference to one copy in Ray's object store, put once per serialized flow run context."""
    serialized = context.get("flow_run_context")
    if not serialized:
        return context
    _flow_module_by_value(serialized.get("flow"))
    return {**context, "flow_run_context": _Stored(_stored(serialized))}


def _flow_module_by_value(flow: object) -> None:
    """Have Ray pickle the flow's module by value when it is a top-level module, as Prefect
    names a flow file it loads by path; a module of a package (`flows.train`) is importable
    on the workers and goes by reference."""
    module = sys.modules.get(getattr(getattr(flow, "fn", None), "__module__", None) or "")
    if module is not None and "." not in module.__name__ and module.__name__ != "__main__":
        ray.cloudpickle.register_pickle_by_value(module)


def load_flow_run_context(context: dict[str, Any]) -> dict[str, Any]:
    """Worker side: `context` with its stored flow run part back, unpickled once per worker."""
    stored = context.get("flow_run_context")
    if not isinstance(stored, _Stored):
        return context
    # a copy of the top level: Prefect builds its context from it, never from the kept one
    return {**context, "flow_run_context": dict(_loaded(stored.ref))}


def _entry(serialized: dict[str, Any]) -> tuple[SettingsContext, SyncClientContext]:
    key = json.dumps(serialized, sort_keys=True, default=str)
    if key not in _cache:
        for _, old in _cache.values():  # another flow run's settings: its client is done
            old.__exit__(None, None, None)
        _cache.clear()
        settings = SettingsContext(**serialized)
        with settings:  # the client reads the API URL and key from these settings
            client = SyncClientContext()
            client.__enter__()  # opened once; closed when the settings change or the process ends
        _cache[key] = (settings, client)
    return _cache[key]


@contextmanager
def reused_prefect_context(context: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Enter the cached settings and client for a task run's serialized `context`; yields
    the context without its settings, which Prefect would otherwise validate again."""
    context = load_flow_run_context(context)
    serialized = context.get("settings_context")
    if not serialized:
        yield context
        return
    settings, client = _entry(serialized)
    with settings:
        # Prefect's get_client and SyncClientContext.get_or_create find this one
        token = SyncClientContext.__var__.set(client)
        try:
            yield {k: v for k, v in context.items() if k != "settings_context"}
        finally:
            SyncClientContext.__var__.reset(token)
