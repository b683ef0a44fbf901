"""Prompt rows and the deterministic prompt stream of a run.

The stream is a pure function of the rollout id, so a retried or resumed `generate(k)`
draws exactly the prompts the first attempt drew, with no state to restore but a check.
"""

from __future__ import annotations

import io
import json

import numpy as np
import pandas as pd

from infra.data.builtin_tasks import builtin_rows
from infra.data.epochs import batch_ends_epoch
from infra.storage.fs import filesystem


def with_split(path: str, split: str) -> str:
    """`builtin:<task>` with the split appended (builtin tasks carry their own train/eval
    split); files are used as given."""
    if path.startswith("builtin:") and path.count(":") == 1:
        return f"{path}:{split}"
    return path


def load_rows(path: str, prompt_key: str, label_key: str, storage_options: dict) -> list[dict]:
    """Rows `{"prompt": str, "label": str}` from `builtin:<task>[:train|eval]` (default train)
    or a `.jsonl` / `.json` (a list of objects) / `.parquet` file, local or `s3://`.
    Labels become strings, so rewards compare text whatever type the file stored."""
    if path.startswith("builtin:"):
        name, _, split = path.removeprefix("builtin:").partition(":")
        return builtin_rows(name, split or "train")
    records = _read_records(path, storage_options)
    if not records:
        raise ValueError(f"no rows in {path}")
    rows = []
    for i, record in enumerate(records):
        for key in (prompt_key, label_key):
            if key not in record:
                raise ValueError(f"column {key!r} missing in {path} (row {i}); columns: {sorted(record)}")
            if _is_null(record[key]):
                raise ValueError(f"column {key!r} is empty in {path} (row {i})")
        prompt = _prompt(record[prompt_key], path, i)
        if not prompt or (isinstance(prompt, str) and not prompt.strip()):
            # the model would be asked to continue nothing: a broken row, not a task
            raise ValueError(f"column {prompt_key!r} holds an empty prompt in {path} (row {i})")
        rows.append({"prompt": prompt, "label": str(record[label_key])})
    return rows


def _prompt(value: object, path: str, row: int) -> str | list[dict]:
    """Text, or chat messages kept as a list of {role, content} (parquet gives arrays)."""
    if isinstance(value, str) or not hasattr(value, "__iter__") or isinstance(value, dict):
        return str(value)
    messages = [dict(m) for m in value if isinstance(m, dict)]
    if len(messages) != len(list(value)) or any({"role", "content"} - set(m) for m in messages):
        raise ValueError(
            f"prompt in {path} (row {row}): a list prompt must hold messages with role and content"
        )
    return [{"role": str(m["role"]), "content": str(m["content"])} for m in messages]


def _is_null(value: object) -> bool:
    # None, NaN and pd.NA: how the formats spell a missing cell
    return pd.api.types.is_scalar(value) and bool(pd.isna(value))


def _read_records(path: str, storage_options: dict) -> list[dict]:
    fs, fs_path = filesystem(path, storage_options)
    if not fs.exists(fs_path):
        raise FileNotFoundError(f"prompt file not found: {path}")
    if path.endswith(".parquet"):
        with fs.open(fs_path, "rb") as f:
            return pd.read_parquet(io.BytesIO(f.read())).to_dict("records")
    if not path.endswith((".jsonl", ".json")):
        raise ValueError(
            f"unsupported prompt file {path}: expected .jsonl, .json, .parquet or builtin:<task>"
        )
    try:
        text = fs.cat_file(fs_path).decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"{path} is not UTF-8 text: {e}") from None
    if path.endswith(".json"):
        try:
            records = json.loads(text)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path} line {e.lineno}: invalid JSON ({e.msg}, column {e.colno})") from None
        if not isinstance(records, list):
            raise ValueError(f"{path} must hold a JSON list of objects, got {type(records).__name__}")
    else:
        records = []
        for number, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise ValueError(f"{path} line {number}: invalid JSON ({e.msg}, column {e.colno})") from None
    if not all(isinstance(r, dict) for r in records):
        raise ValueError(f"every row of {path} must be a JSON object")
    return records


class PromptSource:
    """An endless prompt stream: epoch e is `rows` in the order
    `default_rng(shuffle_seed + e).permutation(len(rows))`, and batch k holds stream
    positions k*B .. (k+1)*B-1, continuing into the next epoch where one ends."""

    def __init__(self, rows: list[dict], batch_size: int, shuffle_seed: int) -> None:
        if not rows:
            raise ValueError("PromptSource needs at least one row")
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.rows = rows
        self.batch_size = batch_size
        self.shuffle_seed = shuffle_seed
        self._perms: dict[int, np.ndarray] = {}

    def _perm(self, epoch: int) -> np.ndarray:
        if epoch not in self._perms:
            self._perms[epoch] = np.random.default_rng(self.shuffle_seed + epoch).permutation(len(self.rows))
        return self._perms[epoch]

    def batch(self, rollout_id: int) -> list[dict]:
        """The prompts of iteration `rollout_id` (copies: callers may annotate them)."""
        if rollout_id < 0:
            raise ValueError(f"rollout_id must be >= 0, got {rollout_id}")
        n = len(self.rows)
        start = rollout_id * self.batch_size
        positions = range(start, start + self.batch_size)
        return [dict(self.rows[self._perm(p // n)[p % n]]) for p in positions]

    def epoch_of(self, rollout_id: int) -> int:
        """Epoch of the batch's first prompt."""
        return rollout_id * self.batch_size // len(self.rows)

    def ends_epoch(self, rollout_id: int) -> bool:
        """True when the batch holds the last prompt of an epoch (it reaches or crosses an
        epoch's end), the moment to save and evaluate at epoch boundaries."""
        return batch_ends_epoch(rollout_id, self.batch_size, len(self.rows))

    def state(self, next_rollout_id: int) -> dict:
        """What a checkpoint records before iteration `next_rollout_id`; the stream itself
        needs only the rollout id, the rest lets `check_state` catch a changed dataset."""
        position = next_rollout_id * self.batch_size
        return {
            "epoch": position // len(self.rows),
            "cursor": position % len(self.rows),
            "shuffle_seed": self.shuffle_seed,
            "num_rows": len(self.rows),
            "batch_size": self.batch_size,
        }

    def check_state(self, state: dict, next_rollout_id: int | None = None) -> None:
        """Raise ValueError if a saved state came from another dataset, seed or batch size
        (a resume would silently draw other prompts); with `next_rollout_id`, also check
        the saved position."""
        expected = self.state(next_rollout_id if next_rollout_id is not None else 0)
        keys = ["num_rows", "shuffle_seed", "batch_size"]
        if next_rollout_id is not None:
            keys += ["epoch", "cursor"]
        diffs = [
            f"{k}: saved {state.get(k)!r}, now {expected[k]!r}" for k in keys if state.get(k) != expected[k]
        ]
        if diffs:
            raise ValueError("saved prompt-source state does not match this run: " + "; ".join(diffs))
