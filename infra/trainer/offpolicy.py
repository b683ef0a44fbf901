"""The old policy's logprobs (a pass before the policy steps, or the only step's own forward),
the reference's (the same pass) and what the old ones say about the rollout.

The PPO ratio's denominator comes from the trainer's own forward, not from the engine
(its numerics differ). In async mode that forward runs with weights one step newer than
the engine's that sampled, so the ratio starts at exactly 1 and says nothing about the
staleness; truncated importance sampling (TIS) weights each token's loss by
min(pi_old / pi_engine, cap) to correct for it. The engine/trainer gap is reported on the
samples generated with the trainer's own weights only, so that it measures numerics and
not staleness.
"""

from __future__ import annotations

import torch
from torch import nn

from infra.config import AlgorithmConfig
from infra.rollout.batch import Sample
from infra.trainer.batches import MicroBatch, all_reduce_max, all_reduce_sum, logits_of
from infra.trainer.losses import LOG_RATIO_CLAMP, tis_weights, token_logprobs
from infra.trainer.parallelize import micro_batches


def _staleness(samples: list[Sample], rollout_id: int | None) -> dict:
    if rollout_id is None:
        return {}
    lags = [rollout_id - s.weight_version for s in samples]
    return {"staleness_mean": sum(lags) / len(lags), "staleness_max": max(lags)}


class OldPolicy:
    """The old policy's logprobs, set on each micro-batch, and what they say about the rollout:
    the engine/trainer gap on fresh and on stale samples, and the TIS weights when `tis`.
    `record` sums per micro-batch; `metrics` reduces the sums over the ranks once, after
    the last micro-batch (every rank calls it, as it is a collective)."""

    def __init__(
        self,
        samples: list[Sample],
        cfg: AlgorithmConfig,
        device: torch.device,
        *,
        tis: bool,
        rollout_id: int | None,
    ) -> None:
        self.samples, self.cfg, self.tis, self.rollout_id = samples, cfg, tis, rollout_id
        # fresh |diff| sum, fresh tokens, stale |diff| sum, stale tokens, tis w sum, tis tokens, tis capped
        self.sums = torch.zeros(7, device=device)
        self.tis_max = torch.zeros(1, device=device)
        self.fresh_diff_max = torch.zeros(1, device=device)
        # the first step's forward records the old logprobs (no pass of their own)
        self.from_first_step = False

    def record(self, mb: MicroBatch, old_logprobs: torch.Tensor) -> None:
        mb.old_logprobs = old_logprobs
        fresh = torch.tensor(
            [
                float(self.rollout_id is None or self.samples[i].weight_version == self.rollout_id)
                for i in mb.index
            ],
            device=old_logprobs.device,
        ).unsqueeze(-1)
        diff = (old_logprobs - mb.engine_logprobs).abs() * mb.engine_mask
        self.sums[0] += (diff * fresh).sum()
        self.sums[1] += (mb.engine_mask * fresh).sum()
        self.sums[2] += (diff * (1 - fresh)).sum()
        self.sums[3] += (mb.engine_mask * (1 - fresh)).sum()
        self.fresh_diff_max = torch.maximum(self.fresh_diff_max, (diff * fresh).max().reshape(1))
        if not self.tis:
            return
        missing = ((mb.mask > 0) & (mb.engine_mask == 0)).any(-1).nonzero().flatten().tolist()
        if missing:
            raise ValueError(
                f"algorithm.tis is on but sample {mb.index[missing[0]]} lacks engine logprobs for "
                "its response; set algorithm.tis=off or have the engines return logprobs"
            )
        mb.tis_weights = tis_weights(old_logprobs, mb.engine_logprobs, self.cfg.tis_cap) * mb.mask
        log_w = (old_logprobs - mb.engine_logprobs).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
        self.sums[4] += mb.tis_weights.sum()
        self.sums[5] += mb.mask.sum()
        self.sums[6] += ((log_w.exp() > self.cfg.tis_cap).float() * mb.mask).sum()
        self.tis_max = torch.maximum(self.tis_max, (mb.tis_weights.max()).reshape(1))

    def metrics(self, world_size: int) -> dict:
        s = all_reduce_sum(self.sums, world_size).tolist()
        metrics = {
            **_staleness(self.samples, self.rollout_id),
            # same weights on both sides: the engine/trainer numeric gap alone
            "train_engine_logprob_abs_diff": s[0] / max(s[1], 1.0),
            "train_engine_logprob_abs_diff_max": float(all_reduce_max(self.fresh_diff_max, world_size)),
            "train_engine_logprob_tokens": int(s[1]),
            # samples from older weights: numerics plus staleness
            "train_engine_logprob_abs_diff_stale": s[2] / max(s[3], 1.0),
            "train_engine_logprob_tokens_stale": int(s[3]),
        }
        if self.tis:
            metrics.update(
                tis_weight_mean=s[4] / max(s[5], 1.0),
                tis_weight_max=float(all_reduce_max(self.tis_max, world_size)),
                tis_capped_frac=s[6] / max(s[5], 1.0),
            )
        return metrics


def old_logprobs_from_first_step(cfg: AlgorithmConfig, plan: list[list[MicroBatch]]) -> bool:
    """Whether the loss's own forward can give the old logprobs, with no pass of their own.

    With one optimizer step on the batch (one planned step, one epoch), every micro-batch's
    loss forward runs on the weights the old-policy pass would use (gradients accumulate,
    the weights change only after the last one), so its logprobs, detached, are the old
    logprobs: the ratio is exactly 1, where a pass of its own gives 1 up to numerics, and
    the gradient is the same. That saves one forward of every micro-batch. With the KL in
    the reward the advantages need every old logprob before the first loss: not then.
    """
    return cfg.ppo_epochs == 1 and len(plan) == 1 and not cfg.kl_in_reward


def old_and_ref_logprobs(
    model: nn.Module,
    ref_model: nn.Module | None,
    plan: list[list[MicroBatch]],
    samples: list[Sample],
    cfg: AlgorithmConfig,
    temperature: float,
    *,
    tis: bool,
    rollout_id: int | None,
    old_pass: bool,
) -> OldPolicy:
    """Before the steps, in one no-grad pass over the plan: the reference logprobs, and the old
    logprobs unless the first step's forward can record them (`old_logprobs_from_first_step`;
    `old_pass` insists on the pass). Returns the old policy, to record into and report on."""
    old = OldPolicy(samples, cfg, next(model.parameters()).device, tis=tis, rollout_id=rollout_id)
    old.from_first_step = not old_pass and old_logprobs_from_first_step(cfg, plan)
    with micro_batches(ref_model), torch.no_grad():
        for mb in (mb for step in plan for mb in step):
            if not old.from_first_step:
                old.record(mb, token_logprobs(logits_of(model, mb), mb.input_ids[:, 1:], temperature))
            if ref_model is not None and cfg.kl_coef > 0:
                mb.ref_logprobs = token_logprobs(logits_of(ref_model, mb), mb.input_ids[:, 1:], temperature)
    if cfg.kl_in_reward and ref_model is None:
        raise ValueError("algorithm.kl_in_reward needs the reference model (algorithm.kl_coef > 0)")
    return old
