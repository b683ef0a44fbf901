"""Experiment trackers: each writes the per-iteration metrics row to one service.

metrics.jsonl and the Prefect artifacts stay the record of a run; a tracker is an extra
view for teams that already watch TensorBoard, Weights & Biases or MLflow.
"""

from __future__ import annotations

import math
import numbers
from typing import Protocol

from infra.config import RunConfig
from infra.storage.fs import RunStore


class Tracker(Protocol):
    def log(self, step: int, metrics: dict[str, float]) -> None: ...

    def close(self) -> None: ...


def scalars(row: dict) -> dict[str, float]:
    """The row's finite numbers (times, rewards, losses); strings and lists are not plotted."""
    return {
        key: float(value)
        for key, value in row.items()
        if isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(float(value))
    }


def make_trackers(cfg: RunConfig, store: RunStore) -> list[Tracker]:
    """One tracker per name in `tracking.backends`; the libraries import only when named."""
    trackers: list[Tracker] = []
    for name in cfg.tracking.backends:
        if name == "tensorboard":
            from infra.tracking.tensorboard import TensorBoardTracker

            trackers.append(TensorBoardTracker(store))
        elif name == "wandb":
            from infra.tracking.wandb import WandbTracker

            trackers.append(WandbTracker(cfg, store))
        elif name == "mlflow":
            from infra.tracking.mlflow import MlflowTracker

            trackers.append(MlflowTracker(cfg, store))
    return trackers


class Trackers:
    """All of a run's trackers behind one `log(row)`."""

    def __init__(self, cfg: RunConfig, store: RunStore) -> None:
        self._trackers = make_trackers(cfg, store)

    def log(self, row: dict) -> None:
        step = int(row.get("rollout_id", 0))
        metrics = scalars(row)
        for tracker in self._trackers:
            tracker.log(step, metrics)

    def close(self) -> None:
        for tracker in self._trackers:
            tracker.close()
        self._trackers = []

    def __getstate__(self) -> dict:
        # The handles that hold this travel to Ray workers with every task; only the driver
        # records metrics, so a copy carries no writer (open files, wandb runs don't pickle).
        return {"_trackers": []}
