"""Prefect's per-task-run context work, done once per process instead.

Worker side: prefect-ray rebuilds Prefect's context for every task run: the flow run's settings are
validated again from a dict and the environment (pydantic-settings, dozens of nested
models), and a new API client is made (an httpx client and an SSL context that loads the
CA bundle). A cProfile of a Ray worker running trivial tasks spent most of each task run
there. A worker runs one task at a time and every task run of a flow run carries the same
settings, so both are made once per process and kept while the settings stay the same.

Flow side: every submit serializes the flow's settings for the worker (a model_dump of
every settings model, ~0.1 s on a busy 2-core machine, in the flow loop's own thread).
The settings context of a flow run does not change; its serialized form is kept.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from prefect.context import SettingsContext, SyncClientContext

# serialized settings -> (their context, a client opened under them); one flow run at a time
_cache: dict[str, tuple[SettingsContext, SyncClientContext]] = {}


_serialize_settings = SettingsContext.serialize
_serialized: dict[tuple[int, bool], tuple[SettingsContext, dict[str, Any]]] = {}


def _serialize_settings_once(self: SettingsContext, include_secrets: bool = True) -> dict[str, Any]:
    # keyed by identity (and the object kept alive, so the id stays its own): Prefect changes
    # settings by entering a new SettingsContext, never by editing one in place
    hit = _serialized.get((id(self), include_secrets))
    if hit is None or hit[0] is not self:
        if len(_serialized) > 16:
            _serialized.clear()
        hit = _serialized[(id(self), include_secrets)] = (self, _serialize_settings(self, include_secrets))
    return hit[1]


def serialize_settings_once() -> None:
    """Make SettingsContext.serialize reuse its result for the same context (the flow's
    process calls it for every task run it submits)."""
    SettingsContext.serialize = _serialize_settings_once


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
