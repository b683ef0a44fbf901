"""One training call: the rollout's samples -> ppo_epochs passes of policy-gradient steps."""

from __future__ import annotations

import torch
from torch import nn

from infra.config import AlgorithmConfig
from infra.rollout.batch import Sample
from infra.trainer.advantages import PublishKL, set_advantages
from infra.trainer.batches import MicroBatch, all_reduce_sum, logits_of, plan_steps
from infra.trainer.losses import (
    aggregation_weights,
    entropy_from_logits,
    kl_penalty,
    policy_loss,
    token_logprobs,
)
from infra.trainer.offpolicy import OldPolicy, old_and_ref_logprobs
from infra.trainer.optimizer_step import guarded_step
from infra.trainer.parallelize import MicroBatches, micro_batches


def train_on_batch(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    samples: list[Sample],
    *,
    rank: int,
    world_size: int,
    cfg: AlgorithmConfig,
    global_batch_size: int,
    temperature: float,
    ref_model: nn.Module | None = None,
    tis: bool = False,
    max_response_len: int = 1,
    rollout_id: int | None = None,
    values: list[list[float]] | None = None,
    publish_kl: PublishKL | None = None,
    old_pass: bool = False,
) -> dict:
    """Train on one rollout; every rank gets the same `samples` and returns the same metrics.

    `old_pass`: give the old logprobs a no-grad pass of their own before the steps even
    where the step's forward could give them (`old_logprobs_from_first_step`); only to
    measure or test what leaving the pass out changes (the result is the same).

    ppo: `values` (the critic's, per response token) replace the samples' scalar advantages
    by per-token GAE advantages; see `set_advantages` for `publish_kl`.

    `rollout_id` is the trainer's weight version (iterations trained so far): samples
    generated with that version measure the engine/trainer numeric mismatch; the others
    are stale by `rollout_id - weight_version`.
    """
    if not samples or len(samples) % global_batch_size or global_batch_size % world_size:
        raise ValueError(
            f"{len(samples)} samples must split into steps of global_batch_size={global_batch_size}, "
            f"itself divisible by world_size={world_size}"
        )
    device = next(model.parameters()).device
    plan = plan_steps(samples, rank, world_size, global_batch_size, cfg, device)
    # the old-policy pass and the first step see the same weights: gathered once for both
    with micro_batches(model) as fsdp:
        old = old_and_ref_logprobs(
            model,
            ref_model,
            plan,
            samples,
            cfg,
            temperature,
            tis=tis,
            rollout_id=rollout_id,
            old_pass=old_pass,
        )
        metrics = set_advantages(plan, samples, cfg, world_size, values=values, publish_kl=publish_kl)
        stats = _policy_steps(
            model, optimizer, scheduler, plan, fsdp, old if old.from_first_step else None,
            cfg=cfg, world_size=world_size, temperature=temperature, max_response_len=max_response_len,
        )  # fmt: skip
    return {**old.metrics(world_size), **metrics, **stats}


def _policy_steps(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    plan: list,
    fsdp: MicroBatches,
    old: OldPolicy | None,
    *,
    cfg: AlgorithmConfig,
    world_size: int,
    temperature: float,
    max_response_len: int,
) -> dict:
    """ppo_epochs passes over the plan: one clipped policy-gradient step per planned step.
    With `old`, each micro-batch's old logprobs are recorded from its own forward, detached
    (one step on the batch: `old_logprobs_from_first_step`)."""
    device = plan[0][0].mask.device
    objective_of = _PolicyObjective(cfg, temperature, max_response_len, old)
    stats = _StepStats(device)
    for _ in range(cfg.ppo_epochs):
        for step in plan:
            tokens, seqs = _step_counts(step, world_size)
            stats.tokens += tokens
            step_loss = torch.zeros((), device=device)
            for i, mb in enumerate(step):
                objective, terms = objective_of(model, mb, tokens, seqs)
                fsdp.before_backward(last=i == len(step) - 1)
                # x world_size undoes FSDP's averaging of gradients over ranks
                (objective * world_size).backward()
                step_loss += objective.detach()
                stats.add_micro_batch(terms, mb.mask)
            step_loss = all_reduce_sum(step_loss, world_size)
            stats.lr = scheduler.get_last_lr()[0]
            norm = guarded_step(model, optimizer, scheduler, step_loss, cfg.grad_clip, world_size)
            stats.add_step(step_loss, norm)
    return stats.metrics(world_size, len(plan) * cfg.ppo_epochs, cfg.ppo_epochs)


def _step_counts(step: list[MicroBatch], world_size: int) -> tuple[float, float]:
    """The step's response tokens and sequences over all ranks (the aggregation's divisors)."""
    counts = torch.stack(
        [sum(mb.mask.sum() for mb in step), sum((mb.mask.sum(-1) > 0).float().sum() for mb in step)]
    )
    tokens, seqs = all_reduce_sum(counts, world_size).tolist()
    return tokens, seqs


class _PolicyObjective:
    """One micro-batch's share of its step's loss: the clipped policy-gradient loss, the
    entropy bonus and, unless the KL is in the reward, the KL penalty, aggregated per
    `agg_mode`. Also the per-token terms the step's metrics sum."""

    def __init__(
        self, cfg: AlgorithmConfig, temperature: float, max_response_len: int, old: OldPolicy | None
    ):
        self.cfg, self.temperature, self.max_response_len, self.old = cfg, temperature, max_response_len, old
        self.eps_high = cfg.eps_clip_high or cfg.eps_clip
        self.gspo = cfg.advantage_estimator == "gspo"
        self.kl_loss = cfg.kl_coef > 0 and not cfg.kl_in_reward

    def __call__(
        self, model: nn.Module, mb: MicroBatch, tokens: float, seqs: float
    ) -> tuple[torch.Tensor, tuple]:
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
        return (per_token * w).sum(), (pl.clipped_high, pl.clipped_low, pl.dual_clipped, entropy, kl)


class _StepStats:
    """What the policy steps report: this rank's sums until `metrics` reduces them."""

    def __init__(self, device: torch.device) -> None:
        # token sums: clipped high, low, dual, entropy, kl
        self.sums = torch.zeros(5, device=device)
        self.losses: list[float] = []
        self.grad_norms: list[float] = []
        self.lr, self.skipped, self.tokens = 0.0, 0, 0.0

    def add_micro_batch(self, terms: tuple, mask: torch.Tensor) -> None:
        self.sums += torch.stack([(t.detach() * mask).sum() for t in terms])

    def add_step(self, step_loss: torch.Tensor, norm: float | None) -> None:
        if norm is None:  # a skipped step (non-finite loss or gradient)
            self.skipped += 1
            return
        self.losses.append(float(step_loss))
        self.grad_norms.append(norm)

    def metrics(self, world_size: int, num_steps: int, ppo_epochs: int) -> dict:
        high, low, dual, entropy, kl = all_reduce_sum(self.sums, world_size).tolist()
        per_token = max(self.tokens, 1.0)
        return {
            "loss": sum(self.losses) / len(self.losses) if self.losses else 0.0,
            "pg_clipfrac": (high + low) / per_token,
            "pg_clipfrac_high": high / per_token,
            "pg_clipfrac_low": low / per_token,
            "pg_clipfrac_dual": dual / per_token,
            "kl": kl / per_token,
            "entropy": entropy / per_token,
            "grad_norm": sum(self.grad_norms) / len(self.grad_norms) if self.grad_norms else 0.0,
            "lr": self.lr,
            "num_steps": num_steps,
            "skipped_steps": self.skipped,
            "response_tokens": int(self.tokens / ppo_epochs),
        }
