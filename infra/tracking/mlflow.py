"""MLflow: metrics of every iteration logged to an MLflow run named after the run.

The tracking URI is `tracking.mlflow_uri`, else `MLFLOW_TRACKING_URI`, else a local
store under `tracking.dir` (or the run folder for local runs).
"""

from __future__ import annotations

import os
import time

from infra.config import RunConfig
from infra.storage.fs import RunStore


class MlflowTracker:
    def __init__(self, cfg: RunConfig, store: RunStore) -> None:
        import mlflow

        uri = cfg.tracking.mlflow_uri or os.environ.get("MLFLOW_TRACKING_URI")
        if not uri:
            folder = cfg.tracking.dir or (store.path("tracking") if store.is_local else "tracking")
            os.makedirs(folder, exist_ok=True)
            uri = "sqlite:///" + os.path.abspath(os.path.join(folder, "mlflow.db"))
        self.client = mlflow.MlflowClient(tracking_uri=uri)
        name = cfg.tracking.project or cfg.run_name
        experiment = self.client.get_experiment_by_name(name)
        experiment_id = experiment.experiment_id if experiment else self.client.create_experiment(name)
        self.run_id = self.client.create_run(experiment_id, run_name=cfg.run_name).info.run_id
        self.uri = uri

    def log(self, step: int, metrics: dict[str, float]) -> None:
        import mlflow

        now_ms = int(time.time() * 1000)
        batch = [mlflow.entities.Metric(k, v, now_ms, step) for k, v in metrics.items()]
        self.client.log_batch(self.run_id, metrics=batch)

    def close(self) -> None:
        self.client.set_terminated(self.run_id)
