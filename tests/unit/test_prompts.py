import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from infra.config import StorageConfig
from infra.data.prompts import PromptSource, load_rows
from infra.storage.fs import storage_options

ROWS = [{"prompt": f"p{i}", "label": str(i)} for i in range(10)]


def test_batches_follow_per_epoch_permutations_across_epoch_boundaries() -> None:
    src = PromptSource(ROWS, batch_size=4, shuffle_seed=3)
    stream = [p for k in range(5) for p in src.batch(k)]  # 20 prompts = 2 epochs
    for epoch in range(2):
        perm = np.random.default_rng(3 + epoch).permutation(10)
        assert stream[epoch * 10 : (epoch + 1) * 10] == [ROWS[i] for i in perm]
    # batch 2 = positions 8..11: the end of epoch 0, then the start of epoch 1
    assert src.epoch_of(2) == 0 and src.ends_epoch(2)
    assert [src.ends_epoch(k) for k in range(5)] == [False, False, True, False, True]


def test_batch_is_a_pure_function_of_rollout_id() -> None:
    a, b = PromptSource(ROWS, 3, 0), PromptSource(ROWS, 3, 0)
    later = a.batch(7)
    for k in range(7):
        a.batch(k)
    assert a.batch(7) == later == b.batch(7)  # order of calls and instance do not matter
    a.batch(7)[0]["prompt"] = "mutated"
    assert a.batch(7) == later
    assert PromptSource(ROWS, 3, 1).batch(0) != a.batch(0)


def test_batch_larger_than_dataset_wraps_into_following_epochs() -> None:
    src = PromptSource(ROWS[:3], batch_size=7, shuffle_seed=0)
    batch = src.batch(1)  # positions 7..13 span epochs 2, 3 and 4
    assert len(batch) == 7 and src.epoch_of(1) == 2 and src.ends_epoch(0) and src.ends_epoch(1)
    assert sorted(r["prompt"] for r in batch[2:5]) == ["p0", "p1", "p2"]  # epoch 3 whole


def test_state_and_check_state() -> None:
    src = PromptSource(ROWS, batch_size=4, shuffle_seed=5)
    state = src.state(3)
    assert state == {"epoch": 1, "cursor": 2, "shuffle_seed": 5, "num_rows": 10, "batch_size": 4}
    src.check_state(state)
    src.check_state(state, next_rollout_id=3)
    with pytest.raises(ValueError, match="cursor"):
        src.check_state(state, next_rollout_id=4)
    with pytest.raises(ValueError, match="num_rows: saved 10, now 9"):
        PromptSource(ROWS[:9], 4, 5).check_state(state)
    with pytest.raises(ValueError, match="shuffle_seed"):
        PromptSource(ROWS, 4, 6).check_state(state)


def test_builtin_paths() -> None:
    assert (
        len(load_rows("builtin:digit-add", "x", "y", {})) == 43 * 15
    )  # train repeats its prompts to EPOCH_ROWS
    assert len(load_rows("builtin:digit-add:eval", "x", "y", {})) == 12
    with pytest.raises(ValueError, match="digit-copy"):
        load_rows("builtin:nope", "prompt", "label", {})


def _write_files(root: str, opts: dict) -> dict[str, str]:
    """The same two rows as .jsonl, .json and .parquet under `root` (local or s3)."""
    import fsspec

    records = [{"q": "1+1=", "a": 2, "extra": "x"}, {"q": "2+3=", "a": 5, "extra": "y"}]
    paths = {ext: f"{root}/data.{ext}" for ext in ("jsonl", "json", "parquet")}
    kw = opts if root.startswith("s3://") else {}
    with fsspec.open(paths["jsonl"], "w", **kw) as f:
        f.write("\n".join(json.dumps(r) for r in records) + "\n")
    with fsspec.open(paths["json"], "w", **kw) as f:
        json.dump(records, f)
    with fsspec.open(paths["parquet"], "wb", **kw) as f:
        pd.DataFrame(records).to_parquet(f)
    return paths


def _check_files(root: str, opts: dict) -> None:
    for path in _write_files(root, opts).values():
        assert load_rows(path, "q", "a", opts) == [
            {"prompt": "1+1=", "label": "2"},
            {"prompt": "2+3=", "label": "5"},
        ]
        with pytest.raises(ValueError, match=r"'answer'.*" + path.rsplit("/", 1)[-1]):
            load_rows(path, "q", "answer", opts)
    missing = f"{root}/missing.jsonl"
    with pytest.raises(FileNotFoundError, match="missing.jsonl"):
        load_rows(missing, "q", "a", opts)


def test_files_local(tmp_path: Path) -> None:
    _check_files(str(tmp_path), {})
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(ValueError, match="no rows in .*empty.jsonl"):
        load_rows(str(tmp_path / "empty.jsonl"), "q", "a", {})
    (tmp_path / "data.csv").write_text("q,a\n")
    with pytest.raises(ValueError, match="unsupported"):
        load_rows(str(tmp_path / "data.csv"), "q", "a", {})


@pytest.mark.s3
def test_files_on_s3(s3_bucket: str) -> None:
    _check_files(s3_bucket, storage_options(StorageConfig(uri=s3_bucket)))
