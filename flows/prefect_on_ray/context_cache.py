"""Prefect's per-task-run context work, done once per process instead.

Worker side: prefect-ray rebuilds Prefect's context for every task run: the flow run's settings are
validated again from a dict and the environment (pydantic-settings, dozens of nested
models), and a new API client is made (an httpx client and an SSL context that loads the
CA bundle). A cProfile of a Ray worker running trivial tasks spent most of each task run
there. A worker runs one task at a time and every task run of a flow run carries the same
settings, so both are made once per process and kept while the settings stay the same.

Flow side: every submit serializes the flow's settings and its flow run context for the
worker (model_dumps of every settings model, of the flow run, the flow and its parameters:
~0.1 s on a busy 2-core machine, in the flow loop's own thread). Neither context changes
during a flow run (Prefect changes them by entering new ones), so each serialized form is
kept. The flow run context also goes to Ray's object store once (~55 KB pickled: the flow
object and its parameter schema); task runs carry a reference to it, and each worker
unpickles it once.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import ray
from prefect.context import EngineContext, SettingsContext, SyncClientContext

from flows.prefect_on_ray.object_store import GetOnce, PutOnce

# serialized settings -> (their context, a client opened under them); one flow run at a time
_cache: dict[str, tuple[SettingsContext, SyncClientContext]] = {}

Serialize = Callable[..., dict[str, Any]]


def _once(serialize: Serialize) -> Serialize:
    """`serialize` with its result kept per context object."""
    # keyed by identity (and the object kept alive, so the id stays its own): Prefect changes
    # a context by entering a new one, never by editing one in place
    kept: dict[tuple[int, bool], tuple[object, dict[str, Any]]] = {}

    def serialize_once(self: Any, include_secrets: bool = True) -> dict[str, Any]:
        hit = kept.get((id(self), include_secrets))
        if hit is None or hit[0] is not self:
            if len(kept) > 4:  # the contexts are kept alive: a few recent ones only
                kept.clear()
            hit = kept[(id(self), include_secrets)] = (self, serialize(self, include_secrets))
        return hit[1]

    serialize_once.__wrapped__ = serialize  # type: ignore[attr-defined]
    return serialize_once


def serialize_contexts_once() -> None:
    """Make the settings' and the flow run's context serialization reuse its result for the
    same context (the flow's process calls both for every task run it submits)."""
    for context in (SettingsContext, EngineContext):
        if not hasattr(context.serialize, "__wrapped__"):
            context.serialize = _once(context.serialize)


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
    return {**context, "flow_run_context": _Stored(_stored(serialized))}


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
