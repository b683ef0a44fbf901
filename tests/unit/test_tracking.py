"""Trackers receive every metrics row: read back with each library's own reader."""

from __future__ import annotations

import glob
import os

import pytest

from infra.config import RunConfig
from infra.storage.fs import RunStore
from infra.tracking import Trackers, scalars

ROWS = [
    {"rollout_id": k, "reward_mean": 0.1 * k, "time_train_s": 0.5, "status": "ok", "flag": True}
    for k in range(3)
]


def _tensorboard_scalars(logdir: str, tag: str) -> list[tuple[int, float]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(logdir)
    acc.Reload()
    return [(e.step, e.value) for e in acc.Scalars(tag)]


def test_scalars_keep_finite_numbers_only() -> None:
    row = {"a": 1, "b": 2.5, "c": "x", "d": True, "e": float("nan"), "f": [1]}
    assert scalars(row) == {"a": 1.0, "b": 2.5}


def test_no_trackers_by_default(tmp_path) -> None:
    cfg = RunConfig(storage={"uri": str(tmp_path)})
    trackers = Trackers(cfg, RunStore(cfg.storage, cfg.run_name))
    trackers.log(ROWS[0])
    trackers.close()
    assert not os.path.exists(tmp_path / cfg.run_name / "tensorboard")


def test_tensorboard_wandb_mlflow_on_a_local_run(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    cfg = RunConfig(storage={"uri": str(tmp_path)}, tracking={"backends": ["tensorboard", "wandb", "mlflow"]})
    store = RunStore(cfg.storage, cfg.run_name)
    trackers = Trackers(cfg, store)
    wandb_tracker = next(t for t in trackers._trackers if type(t).__name__ == "WandbTracker")
    mlflow_tracker = next(t for t in trackers._trackers if type(t).__name__ == "MlflowTracker")
    for row in ROWS:
        trackers.log(row)
    assert wandb_tracker.run.summary["reward_mean"] == pytest.approx(0.2)
    trackers.close()

    got = _tensorboard_scalars(store.path("tensorboard"), "reward_mean")
    assert [s for s, _ in got] == [0, 1, 2]
    assert [v for _, v in got] == pytest.approx([0.0, 0.1, 0.2])
    # wandb offline: the run's files live under the run folder, nothing was sent anywhere
    assert glob.glob(os.path.join(store.path("tracking"), "wandb", "offline-run-*", "run-*.wandb"))

    import mlflow

    history = mlflow.MlflowClient(mlflow_tracker.uri).get_metric_history(mlflow_tracker.run_id, "reward_mean")
    assert sorted((m.step, m.value) for m in history) == [(0, 0.0), (1, 0.1), (2, pytest.approx(0.2))]


@pytest.mark.s3
def test_tensorboard_events_reach_s3(s3_bucket, tmp_path) -> None:
    cfg = RunConfig(storage={"uri": f"{s3_bucket}/runs"}, tracking={"backends": ["tensorboard"]})
    store = RunStore(cfg.storage, cfg.run_name)
    trackers = Trackers(cfg, store)
    trackers.log(ROWS[0])
    # uploaded after every row, not only at the end
    (name,) = store.ls("tensorboard")
    trackers.log(ROWS[1])
    trackers.close()
    local = tmp_path / "tb"
    local.mkdir()
    (local / name).write_bytes(store.read_bytes(f"tensorboard/{name}"))
    assert [s for s, _ in _tensorboard_scalars(str(local), "reward_mean")] == [0, 1]


def test_trackers_travel_to_workers_empty(tmp_path) -> None:
    import pickle

    cfg = RunConfig(storage={"uri": str(tmp_path)}, tracking={"backends": ["tensorboard"]})
    trackers = Trackers(cfg, RunStore(cfg.storage, cfg.run_name))
    copy = pickle.loads(pickle.dumps(trackers))
    assert copy._trackers == [] and len(trackers._trackers) == 1
    trackers.close()
