"""What the task runs of the pipeline's SFT and eval stages hold (infra/stage_systems.py
starts their actors): actor handles and a few strings, one method per task."""

from __future__ import annotations

import time
from dataclasses import dataclass

import ray

from infra.cluster.rank_group import RankGroup
from infra.config import RunConfig
from infra.sft_stage import export_uri, mark_finished
from infra.storage.fs import storage_options


@dataclass
class SFTHandles:
    cfg: RunConfig
    trainers: RankGroup
    model_uri: str  # the model SFT starts from
    plan: dict  # examples, dropped rows, steps per epoch

    def epoch(self, epoch: int) -> dict:
        return self.trainers.call("sft_epoch", epoch, what=f"sft epoch {epoch}")[0]

    def export(self, metrics: dict) -> dict:
        """Write the fine-tuned model (full weights, a LoRA adapter merged in), then mark the
        stage done; a repeat writes the same model again."""
        t0 = time.monotonic()
        uri = export_uri(self.cfg)
        self.trainers.call("export_hf", uri, storage_options(self.cfg.storage), True, what="sft export")
        return {**mark_finished(self.cfg, metrics), "time_export_s": time.monotonic() - t0}


@dataclass
class EvalHandles:
    cfg: RunConfig
    manager: ray.actor.ActorHandle
    model_uri: str  # the model the engines serve

    def evaluate(self, rollout_id: int) -> dict:
        return ray.get(self.manager.evaluate.remote(rollout_id))
