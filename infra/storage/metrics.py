"""Metrics of a run as JSON lines in `metrics.jsonl`, one row per iteration (or eval)."""

from __future__ import annotations

import json
import math
import os

from infra.storage.fs import RunStore

METRICS_FILE = "metrics.jsonl"


def _json_safe(value: object) -> object:
    """Plain JSON types: numpy / torch scalars become Python numbers, and NaN / inf become
    null, since they are not JSON and other readers (jq, JS) reject them."""
    if isinstance(value, dict):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json_safe(v) for v in value]
    if hasattr(value, "tolist") and not isinstance(value, str | bytes):
        # numpy scalars and arrays, 0-d tensors; no numpy or torch import needed
        return _json_safe(value.tolist())
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if value is None or isinstance(value, str | bool | int | float):
        return value
    raise TypeError(f"metric value {value!r} of type {type(value).__name__} is not JSON-serialisable")


def append_metrics(store: RunStore, row: dict) -> None:
    line = json.dumps(_json_safe(row)) + "\n"
    if store.is_local:
        path = store.path(METRICS_FILE)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "a", encoding="utf-8") as f:
            f.write(line)
        return
    # S3 objects are immutable (no append): read and rewrite the whole file. Fine for the
    # hundreds of rows of a run, and only the driver writes metrics, so there is no race.
    old = store.read_text(METRICS_FILE) if store.exists(METRICS_FILE) else ""
    store.write_text(METRICS_FILE, old + line)


def read_metrics(store: RunStore) -> list[dict]:
    """All rows, oldest first; [] before the first row."""
    if not store.exists(METRICS_FILE):
        return []
    lines = store.read_text(METRICS_FILE).split("\n")
    # A crash during a local append can leave a last line without its newline: it is not a
    # complete row, so skip it (truncate_metrics on resume then rewrites the file clean).
    complete = lines[:-1]
    rows = []
    for number, line in enumerate(complete, 1):
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise ValueError(f"{store.uri(METRICS_FILE)} line {number} is not JSON: {e}") from None
    return rows


def truncate_metrics(store: RunStore, keep_below_rollout_id: int) -> int:
    """Drop rows with rollout_id >= `keep_below_rollout_id` (written after the checkpoint a
    run resumes from, and about to be written again); return how many were dropped."""
    rows = read_metrics(store)
    kept = [r for r in rows if r.get("rollout_id", -1) < keep_below_rollout_id]
    if store.exists(METRICS_FILE):
        store.write_text(METRICS_FILE, "".join(json.dumps(r) + "\n" for r in kept))
    return len(rows) - len(kept)
