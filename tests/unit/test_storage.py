import dataclasses
import json
import os
import pickle
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from infra.config import StorageConfig
from infra.rollout.batch import Sample
from infra.rollout.rollout_files import read_rollout, write_rollout
from infra.storage.fs import RunStore, join, storage_options
from infra.storage.metrics import append_metrics, read_metrics, truncate_metrics


def _sample(i: int) -> Sample:
    return Sample(
        prompt=f"{i}+1=",
        label=str(i + 1),
        response=str(i + 1),
        prompt_ids=[1, 2, 3],
        response_ids=[4] * i,  # empty for i = 0
        engine_logprobs=[-0.5] * i,
        weight_version=3,
        group=i // 2,
        reward=1.0,
    )


def test_run_store_files(storage_uri: str) -> None:
    store = RunStore(StorageConfig(uri=storage_uri), "run-1")
    assert store.run_uri == join(
        storage_uri if "://" in storage_uri else os.path.abspath(storage_uri), "run-1"
    )
    assert store.uri("a", "b.txt") == store.run_uri + "/a/b.txt"
    assert not store.exists("a/b.txt") and store.ls("a") == []
    store.write_text("a/b.txt", "hello")
    store.write_bytes("a/c/d.bin", b"\x00\x01")
    assert store.exists("a/b.txt") and store.read_text("a/b.txt") == "hello"
    assert store.read_bytes("a/c/d.bin") == b"\x00\x01"
    assert store.ls("a") == ["b.txt", "c"]
    store.write_text("a/b.txt", "again")  # overwrite
    assert store.read_text("a/b.txt") == "again"
    with pytest.raises(FileNotFoundError, match="nope.txt"):
        store.read_text("nope.txt")
    store.delete("a/b.txt")
    store.delete("a/b.txt")  # idempotent
    store.delete("a/c", recursive=True)
    assert store.ls("a") == [] and not store.exists("a/c/d.bin")
    clone = pickle.loads(pickle.dumps(store))  # travels to Ray workers
    clone.write_text("x.txt", "1")
    assert store.read_text("x.txt") == "1"


def test_local_paths_are_absolute(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    store = RunStore(StorageConfig(uri="runs"), "r")
    assert store.run_uri == str(tmp_path / "runs" / "r")
    store.write_text("deep/er/f.txt", "x")  # parents created
    assert (tmp_path / "runs/r/deep/er/f.txt").read_text() == "x"
    assert [p.name for p in (tmp_path / "runs/r/deep/er").iterdir()] == ["f.txt"]  # no tmp left


def test_rollout_parquet_round_trip(storage_uri: str) -> None:
    store = RunStore(StorageConfig(uri=storage_uri), "run")
    uri = write_rollout(store, 7, [_sample(i) for i in range(4)])
    assert uri == store.uri("rollouts/0000007.parquet")
    df = read_rollout(store, 7)
    assert list(df.columns) == [*(f.name for f in dataclasses.fields(Sample)), "rollout_id"]
    assert df["rollout_id"].tolist() == [7] * 4 and df["group"].tolist() == [0, 0, 1, 1]
    assert [list(x) for x in df["response_ids"]] == [[4] * i for i in range(4)]
    # a user opens the file by its URI with pandas alone
    user_df = pd.read_parquet(uri, storage_options=store.options if "://" in uri else None)
    pd.testing.assert_frame_equal(user_df, df)
    write_rollout(store, 8, [])  # an empty rollout still has the full schema
    assert list(read_rollout(store, 8).columns) == list(df.columns)


@pytest.mark.s3
def test_user_reads_s3_rollout_with_env_credentials_only(s3_bucket: str) -> None:
    uri = write_rollout(RunStore(StorageConfig(uri=s3_bucket), "run"), 0, [_sample(1)])
    assert uri.startswith("s3://")
    assert pd.read_parquet(uri)["prompt"].tolist() == ["1+1="]  # endpoint and creds from AWS_* env


def test_metrics_append_read_truncate(storage_uri: str) -> None:
    store = RunStore(StorageConfig(uri=storage_uri), "run")
    assert read_metrics(store) == []
    for k in range(4):
        append_metrics(
            store, {"rollout_id": k, "reward": np.float32(0.5), "n": np.int64(k), "loss": float("nan")}
        )
    append_metrics(store, {"event": "note"})
    rows = read_metrics(store)
    assert rows[1] == {"rollout_id": 1, "reward": 0.5, "n": 1, "loss": None}
    assert len(rows) == 5 and rows[-1] == {"event": "note"}
    assert truncate_metrics(store, keep_below_rollout_id=2) == 2
    assert [r.get("rollout_id") for r in read_metrics(store)] == [0, 1, None]
    append_metrics(store, {"rollout_id": 2})
    assert [r.get("rollout_id") for r in read_metrics(store)] == [0, 1, None, 2]
    with pytest.raises(TypeError, match="object"):
        append_metrics(store, {"bad": object()})


def test_torn_last_metrics_line_is_skipped(tmp_path: Path) -> None:
    store = RunStore(StorageConfig(uri=str(tmp_path)), "run")
    append_metrics(store, {"rollout_id": 0})
    with open(store.path("metrics.jsonl"), "a") as f:
        f.write('{"rollout_id": 1, "rew')  # crash mid-write
    assert read_metrics(store) == [{"rollout_id": 0}]
    truncate_metrics(store, keep_below_rollout_id=1)
    append_metrics(store, {"rollout_id": 1})
    assert read_metrics(store) == [{"rollout_id": 0}, {"rollout_id": 1}]


def test_storage_options_carry_no_credentials(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIDSECRETID")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "very-secret")
    monkeypatch.setenv("AWS_SESSION_TOKEN", "tok")
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://env:9000")
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", "http://env-s3:9000")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "eu-west-1")
    monkeypatch.delenv("AWS_REGION", raising=False)
    opts = storage_options(StorageConfig(uri="s3://b", profile="dev"))
    assert opts == {
        "endpoint_url": "http://env-s3:9000",
        "client_kwargs": {"region_name": "eu-west-1"},
        "profile": "dev",
    }
    text = json.dumps(opts)
    assert not any(secret in text for secret in ("AKIDSECRETID", "very-secret", "tok"))
    explicit = storage_options(StorageConfig(uri="s3://b", endpoint_url="http://cfg:1", region="us-west-2"))
    assert explicit == {"endpoint_url": "http://cfg:1", "client_kwargs": {"region_name": "us-west-2"}}
