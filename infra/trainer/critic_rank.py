"""One FSDP2 rank of the PPO critic. A plain class: the driver wraps it with `ray.remote`.

The critic is a value head on the policy's transformer: transformers' own
`AutoModelForTokenClassification` with one label (for Llama, `LlamaForTokenClassification`),
loaded from the same HF directory; its `score` head starts fresh. Its ranks form their own
process group in their own processes, beside the actor's, and are never synced to engines.
As the actor's, this module imports torch only inside the methods (see infra/trainer/rank.py).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from infra.config import RunConfig
from infra.heap import freeze_startup_heap
from infra.model.loading import localize
from infra.rollout.batch import RolloutBatch
from infra.trainer.batch_inbox import FromManager
from infra.trainer.fsdp_rank import FSDPRank

if TYPE_CHECKING:
    import torch


def load_value_model(path: str) -> torch.nn.Module:
    """The value model of an HF directory, fp32. Its head's dropout is off (transformers
    defaults it to 0.1), as verl does: a value is then a function of the tokens, the same in
    the forward that computes the values and in the one that trains on them."""
    import torch
    from transformers import AutoConfig, AutoModelForTokenClassification

    config = AutoConfig.from_pretrained(path, num_labels=1)
    config.classifier_dropout = 0.0
    return AutoModelForTokenClassification.from_pretrained(path, config=config, dtype=torch.float32)


class CriticRank(FSDPRank):
    def __init__(self, cfg: RunConfig, rank: int, world_size: int) -> None:
        super().__init__(cfg, rank, world_size)
        self._values: tuple[int, torch.Tensor] | None = None  # (rollout id, [N, L] values)

    def setup(self, model_uri: str, storage_options: dict, master_addr: str, master_port: int) -> None:
        """Join the critic group and load the value model (the policy's directory by default)."""
        import torch

        path = localize(self.cfg.critic.model_path or model_uri, storage_options)
        self._join(master_addr, master_port)
        # every rank draws the same fresh head: each shards its own full copy
        torch.manual_seed(self.cfg.algorithm.seed)
        self.model = self._load(path)
        c = self.cfg.critic
        self._optimize(c.lr, self.cfg.algorithm.betas, c.weight_decay, c.warmup_steps, "constant", 1.0)
        freeze_startup_heap()

    def _load(self, path: str) -> torch.nn.Module:
        from infra.trainer.parallelize import parallelize

        model = load_value_model(path)
        model.train()
        return parallelize(model, self.world_size, self.cfg.cluster.fsdp_gather)

    def compute_values(self, rollout_id: int, batch: RolloutBatch | FromManager) -> list[list[float]]:
        """The values of the rollout's response tokens; kept for `train`, returned by rank 0.
        `batch`: as in TrainerRank.train (staged, or fetched from the manager)."""
        from infra.trainer.critic_step import compute_values
        from infra.trainer.ppo_targets import as_lists

        batch = self.inbox.take(rollout_id, batch)
        values = compute_values(self.model, batch.samples, self.cfg, self.rank, self.world_size)
        self._values = (rollout_id, values)
        return as_lists(values, batch.samples) if self.rank == 0 else []

    def train(
        self, rollout_id: int, batch: RolloutBatch | FromManager, kl: list[list[float]] | None = None
    ) -> dict:
        """Fit the returns of GAE over this rollout's values; `kl`: the actor's per-token KL
        when it is in the reward (the actor computes it; the returns then match its advantages)."""
        from infra.trainer.critic_step import train_critic_on_batch
        from infra.trainer.ppo_targets import from_lists, ppo_targets

        batch = self.inbox.take(rollout_id, batch)  # compute_values left it in the inbox
        start = time.perf_counter()
        if self._values is None or self._values[0] != rollout_id:
            raise RuntimeError(f"critic train {rollout_id}: compute_values of that rollout must come first")
        samples, values = batch.samples, self._values[1]
        alg = self.cfg.algorithm
        kl_t = from_lists(kl, samples, values.device) if kl is not None else None
        _, returns = ppo_targets(samples, values, alg.gamma, alg.lam, kl_t, alg.kl_coef)
        metrics = train_critic_on_batch(
            self.model, self.optimizer, self.scheduler, samples, values, returns,
            cfg=self.cfg, rank=self.rank, world_size=self.world_size,
        )  # fmt: skip
        self._values = None
        return {**metrics, "time_critic_step_s": time.perf_counter() - start}

    def shutdown(self) -> None:
        self._leave()
