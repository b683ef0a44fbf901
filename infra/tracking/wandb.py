"""Weights & Biases: one wandb run per flow run, resumed by id across nightly runs.

No account is needed with `WANDB_MODE=offline` (the files stay under `tracking.dir`,
`wandb sync` uploads them later); online mode uses the usual `WANDB_API_KEY`.
"""

from __future__ import annotations

import os

from infra.config import RESOLVED_SEEDS, RunConfig
from infra.storage.fs import RunStore


class WandbTracker:
    def __init__(self, cfg: RunConfig, store: RunStore) -> None:
        import wandb

        folder = cfg.tracking.dir or (store.path("tracking") if store.is_local else "tracking")
        os.makedirs(folder, exist_ok=True)
        self.run = wandb.init(
            project=cfg.tracking.project or cfg.run_name,
            name=cfg.run_name,
            id=cfg.run_name,  # the same run name continues the same wandb run (resume=auto)
            resume="allow",
            dir=folder,
            config=cfg.model_dump(mode="json", context=RESOLVED_SEEDS),
        )

    def log(self, step: int, metrics: dict[str, float]) -> None:
        self.run.log(metrics, step=step, commit=True)  # the row is whole: no later keys for this step

    def close(self) -> None:
        self.run.finish()
