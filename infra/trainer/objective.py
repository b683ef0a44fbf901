"""The policy's loss over one optimizer step: forward, loss and backward of each of the step's
micro-batches, and the per-token terms the training call reports.

Each micro-batch's share is the clipped policy-gradient loss, the entropy bonus and, unless
the KL is in the reward, the KL penalty, aggregated per `agg_mode` with the counts of the
whole step (`aggregation_weights`).
"""

from __future__ import annotations

import torch
from torch import nn

from infra.config import AlgorithmConfig
from infra.trainer.batches import MicroBatch, all_reduce_sum, logits_of
from infra.trainer.losses import (
    aggregation_weights,
    entropy_from_logits,
    kl_penalty,
    policy_loss,
    token_logprobs,
)
from infra.trainer.offpolicy import OldPolicy
from infra.trainer.parallelize import MicroBatches


def _step_counts(step: list[MicroBatch], world_size: int) -> tuple[float, float]:
    """The step's response tokens and sequences over all ranks (the aggregation's divisors)."""
    counts = torch.stack(
        [sum(mb.mask.sum() for mb in step), sum((mb.mask.sum(-1) > 0).float().sum() for mb in step)]
    )
    tokens, seqs = all_reduce_sum(counts, world_size).tolist()
    return tokens, seqs


class PolicyObjective:
    """The steps' losses and backwards; `metrics` reduces this rank's sums of the per-token
    terms over the ranks once, after the last step. When `old.from_first_step`, each
    micro-batch's old logprobs are recorded from its own forward, detached."""

    def __init__(
        self,
        cfg: AlgorithmConfig,
        old: OldPolicy,
        world_size: int,
        device: torch.device,
        *,
        temperature: float,
        max_response_len: int,
    ) -> None:
        self.cfg, self.world_size = cfg, world_size
        self.temperature, self.max_response_len = temperature, max_response_len
        self.old = old if old.from_first_step else None
        self.eps_high = cfg.eps_clip_high or cfg.eps_clip
        self.gspo = cfg.advantage_estimator == "gspo"
        self.kl_loss = cfg.kl_coef > 0 and not cfg.kl_in_reward
        # token sums: clipped high, low, dual, entropy, kl, ppo_kl
        self.sums = torch.zeros(6, device=device)
        self.tokens = 0.0

    def backward(self, model: nn.Module, step: list[MicroBatch], fsdp: MicroBatches) -> torch.Tensor:
        """Forward and backward of the step's micro-batches; the step's loss, summed over ranks."""
        tokens, seqs = _step_counts(step, self.world_size)
        self.tokens += tokens
        step_loss = torch.zeros((), device=self.sums.device)
        for i, mb in enumerate(step):
            objective, terms = self._micro_batch(model, mb, tokens, seqs)
            fsdp.before_backward(last=i == len(step) - 1)
            # x world_size undoes FSDP's averaging of gradients over ranks
            (objective * self.world_size).backward()
            step_loss += objective.detach()
            self.sums += torch.stack([(t.detach() * mb.mask).sum() for t in terms])
        return all_reduce_sum(step_loss, self.world_size)

    def _micro_batch(
        self, model: nn.Module, mb: MicroBatch, tokens: float, seqs: float
    ) -> tuple[torch.Tensor, tuple]:
        """One micro-batch's share of its step's loss, and the per-token terms the metrics sum."""
        cfg = self.cfg
        logits = logits_of(model, mb)
        logp = token_logprobs(logits, mb.input_ids[:, 1:], self.temperature)
        if self.old is not None:
            self.old.record(mb, logp.detach())
        pl = policy_loss(
            logp, mb.old_logprobs, mb.advantages, mb.mask, cfg.eps_clip, self.eps_high,
            None if self.gspo else cfg.clip_ratio_c, sequence_level=self.gspo,
        )  # fmt: skip
        per_token = pl.loss if mb.tis_weights is None else pl.loss * mb.tis_weights
        entropy = entropy_from_logits(logits if cfg.entropy_coef else logits.detach(), self.temperature)
        per_token = per_token - cfg.entropy_coef * entropy
        kl = torch.zeros_like(logp)
        if mb.ref_logprobs is not None:
            kl = kl_penalty(logp, mb.ref_logprobs, cfg.kl_type)
            if self.kl_loss:
                per_token = per_token + cfg.kl_coef * kl
        w = aggregation_weights(mb.mask, cfg.agg_mode, tokens, seqs, self.max_response_len)
        terms = (pl.clipped_high, pl.clipped_low, pl.dual_clipped, entropy, kl, pl.ppo_kl)
        return (per_token * w).sum(), terms

    def metrics(self) -> dict:
        high, low, dual, entropy, kl, ppo_kl = all_reduce_sum(self.sums, self.world_size).tolist()
        per_token = max(self.tokens, 1.0)
        # verl's names and meanings: pg_clipfrac (the ratio clipped, either side),
        # pg_clipfrac_lower (the dual clip's cap applied), ppo_kl (mean old logp - logp)
        return {
            "pg_clipfrac": (high + low) / per_token,
            "pg_clipfrac_high": high / per_token,
            "pg_clipfrac_lower": dual / per_token,
            "ppo_kl": ppo_kl / per_token,
            "kl": kl / per_token,
            "entropy": entropy / per_token,
            "response_tokens": int(self.tokens / self.cfg.ppo_epochs),
        }
