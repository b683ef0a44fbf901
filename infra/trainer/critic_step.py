"""The critic's two calls per rollout: its values (forward, no grad), then ppo_epochs passes
of clipped value-loss steps against the GAE returns.

The value head reads one number per position; the value of response token j is read at
the position that predicts it (p + j - 1), where the actor reads its logprob.
"""

from __future__ import annotations

import torch
from torch import nn

from infra.config import RunConfig
from infra.rollout.batch import Sample
from infra.trainer.batches import MicroBatch, all_reduce_sum, plan_steps
from infra.trainer.critic_losses import clipped_value_loss
from infra.trainer.optimizer_step import guarded_step
from infra.trainer.parallelize import MicroBatches, micro_batches
from infra.trainer.ppo_targets import response_mask, response_width, to_positions, to_response


def values_of(model: nn.Module, mb: MicroBatch) -> torch.Tensor:
    """[B, T-1]: the value head at every position that predicts a next token."""
    return model(input_ids=mb.input_ids, use_cache=False).logits[:, :-1, 0]


def _plan(model: nn.Module, samples: list[Sample], cfg: RunConfig, rank: int, world_size: int) -> list:
    # as the actor: default, the whole rollout as it arrived, even if the manager dropped samples
    gbs = cfg.algorithm.global_batch_size or len(samples)
    if not samples or len(samples) % gbs or gbs % world_size:
        raise ValueError(
            f"{len(samples)} samples must split into steps of global_batch_size={gbs}, "
            f"itself divisible by the critic's world_size={world_size}"
        )
    device = next(model.parameters()).device
    return plan_steps(samples, rank, world_size, gbs, cfg.algorithm, device)


def compute_values(
    model: nn.Module, samples: list[Sample], cfg: RunConfig, rank: int, world_size: int
) -> torch.Tensor:
    """[N, L] values of every response token of the rollout (the same on every rank)."""
    plan = _plan(model, samples, cfg, rank, world_size)
    out = torch.zeros(len(samples), response_width(samples), device=plan[0][0].mask.device)
    with torch.no_grad(), micro_batches(model):
        for mb in (mb for step in plan for mb in step):  # each rank fills the rows it holds
            to_response(values_of(model, mb) * mb.mask, mb, samples, out)
    return all_reduce_sum(out, world_size)


def _value_stats(values: torch.Tensor, returns: torch.Tensor, samples: list[Sample]) -> dict:
    mask = response_mask(samples).to(values.device)
    n = mask.sum().clamp(min=1)

    def var(x: torch.Tensor) -> torch.Tensor:
        mean = (x * mask).sum() / n
        return (((x - mean) ** 2) * mask).sum() / n

    # 1 - Var(R - V) / Var(R): 1 when the values predict the returns, <= 0 when no better than a constant
    explained = 1.0 - var(returns - values) / var(returns).clamp(min=1e-8)
    return {
        "value_mean": float((values * mask).sum() / n),
        "returns_mean": float((returns * mask).sum() / n),
        "value_explained_var": float(explained),
    }


def _value_loss_backward(
    model: nn.Module,
    step: list[MicroBatch],
    samples: list[Sample],
    values: torch.Tensor,
    returns: torch.Tensor,
    fsdp: MicroBatches,
    *,
    cfg: RunConfig,
    world_size: int,
) -> tuple[torch.Tensor, float, float]:
    """Forward and backward of one step's micro-batches; the step's loss (summed over ranks),
    clipped token count and response tokens."""
    counts = torch.stack(
        [sum(mb.mask.sum() for mb in step), sum((mb.mask.sum(-1) > 0).float().sum() for mb in step)]
    )
    tokens, seqs = all_reduce_sum(counts, world_size).tolist()
    step_loss = torch.zeros((), device=counts.device)
    step_clipped = torch.zeros((), device=counts.device)
    for i, mb in enumerate(step):
        loss, frac = clipped_value_loss(
            values_of(model, mb),
            to_positions(values, mb, samples),
            to_positions(returns, mb, samples),
            mb.mask,
            cfg.critic.cliprange_value,
            cfg.algorithm.agg_mode,
            counts=(tokens, seqs, cfg.rollout.sampling.max_new_tokens),
        )
        fsdp.before_backward(last=i == len(step) - 1)
        (loss * world_size).backward()  # x world_size undoes FSDP's averaging over ranks
        step_loss += loss.detach()
        step_clipped += frac * mb.mask.sum()
    clipped = float(all_reduce_sum(step_clipped, world_size))
    return all_reduce_sum(step_loss, world_size), clipped, tokens


def train_critic_on_batch(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    samples: list[Sample],
    values: torch.Tensor,
    returns: torch.Tensor,
    *,
    cfg: RunConfig,
    rank: int,
    world_size: int,
) -> dict:
    """Clipped value loss against `returns`, clipping around the rollout-time `values` ([N, L])."""
    plan = _plan(model, samples, cfg, rank, world_size)
    alg, critic = cfg.algorithm, cfg.critic
    losses, norms, skipped, clipped, tokens_seen = [], [], 0, 0.0, 0.0
    with micro_batches(model) as fsdp:
        for step in (step for _ in range(alg.ppo_epochs) for step in plan):
            step_loss, step_clipped, tokens = _value_loss_backward(
                model, step, samples, values, returns, fsdp, cfg=cfg, world_size=world_size
            )
            clipped += step_clipped
            tokens_seen += tokens
            norm = guarded_step(model, optimizer, scheduler, step_loss, critic.grad_clip, world_size)
            if norm is None:
                skipped += 1
                continue
            losses.append(float(step_loss))
            norms.append(norm)
    return {
        **_value_stats(values, returns, samples),
        "value_loss": sum(losses) / len(losses) if losses else 0.0,
        "value_clipfrac": clipped / max(tokens_seen, 1.0),
        "value_grad_norm": sum(norms) / len(norms) if norms else 0.0,
        "critic_lr": scheduler.get_last_lr()[0],
        "critic_num_steps": len(plan) * alg.ppo_epochs,
        "critic_skipped_steps": skipped,
    }
