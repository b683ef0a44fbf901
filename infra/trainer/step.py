"""One training call: the rollout's samples -> optimizer steps of PPO-clip (GRPO) updates."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor

from infra.config import AlgorithmConfig
from infra.rollout.batch import Sample
from infra.trainer.losses import entropy_from_logits, kl_k3, ppo_clip_loss, token_logprobs


@dataclass
class _MicroBatch:
    input_ids: torch.Tensor  # [B, T] prompt + response, right-padded
    mask: torch.Tensor  # [B, T-1] 1 where the next token is a response token
    advantages: torch.Tensor  # [B, 1]
    engine_logprobs: torch.Tensor  # [B, T-1], aligned with mask
    engine_mask: torch.Tensor  # [B, T-1], mask of samples whose engine logprobs are complete
    old_logprobs: torch.Tensor | None = None
    ref_logprobs: torch.Tensor | None = None


def _collate(samples: list[Sample], device: torch.device) -> _MicroBatch:
    # Pad id 0 is arbitrary: right padding under a causal mask never influences real tokens
    # and padded positions are masked out of every loss and metric. Length >= 2 so that a
    # micro-batch of empty responses still yields one (masked) target position.
    length = max(2, *(len(s.prompt_ids) + len(s.response_ids) for s in samples))
    ids = torch.zeros(len(samples), length, dtype=torch.long)
    mask = torch.zeros(len(samples), length - 1)
    engine = torch.zeros(len(samples), length - 1)
    engine_mask = torch.zeros(len(samples), length - 1)
    for i, s in enumerate(samples):
        p, r = len(s.prompt_ids), len(s.response_ids)
        ids[i, : p + r] = torch.tensor(s.prompt_ids + s.response_ids, dtype=torch.long)
        if r == 0 or p == 0:  # nothing to learn from (no response, or no context to predict it)
            continue
        # logits at position t predict token t + 1: response token j is predicted at p + j - 1
        mask[i, p - 1 : p + r - 1] = 1.0
        if len(s.engine_logprobs) == r:
            engine[i, p - 1 : p + r - 1] = torch.tensor(s.engine_logprobs)
            engine_mask[i, p - 1 : p + r - 1] = 1.0
    advantages = torch.tensor([[s.advantage] for s in samples], dtype=torch.float32)
    return _MicroBatch(*(t.to(device) for t in (ids, mask, advantages, engine, engine_mask)))


def _logits(model: nn.Module, mb: _MicroBatch) -> torch.Tensor:
    return model(input_ids=mb.input_ids, use_cache=False).logits[:, :-1]


def _all_reduce_sum(t: torch.Tensor, world_size: int) -> torch.Tensor:
    if world_size > 1 and dist.is_initialized():
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t


def _clip_grad_norm(model: nn.Module, max_norm: float) -> float:
    # Torchtitan's recipe: the norm of FSDP2's sharded DTensor grads is a partial result;
    # full_tensor() reduces it across ranks into the true global norm before clipping.
    params = [p for p in model.parameters() if p.grad is not None]
    total = torch.nn.utils.get_total_norm([p.grad for p in params], norm_type=2.0)
    if isinstance(total, DTensor):
        total = total.full_tensor()
    torch.nn.utils.clip_grads_with_norm_(params, max_norm, total)
    return float(total)


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
) -> dict:
    """Train on one rollout; every rank gets the same `samples` and returns the same metrics."""
    if not samples or len(samples) % global_batch_size or global_batch_size % world_size:
        raise ValueError(
            f"{len(samples)} samples must split into steps of global_batch_size={global_batch_size}, "
            f"itself divisible by world_size={world_size}"
        )
    device = next(model.parameters()).device
    per_rank, mbs = global_batch_size // world_size, cfg.micro_batch_size
    # Every rank runs the same number of micro-batches: FSDP's collectives must pair up.
    plan: list[list[_MicroBatch]] = []
    for start in range(0, len(samples), global_batch_size):
        mine = samples[start + rank * per_rank : start + (rank + 1) * per_rank]
        plan.append([_collate(mine[i : i + mbs], device) for i in range(0, per_rank, mbs)])

    # Logprob recompute: the PPO ratio's denominator comes from the trainer's own forward
    # with the weights the rollout was sampled from, not from the engine (its numerics
    # differ); the gap to the engine is reported as a health metric.
    diff_sum = torch.zeros((), device=device)
    diff_count = torch.zeros((), device=device)
    with torch.no_grad():
        for mb in (mb for step in plan for mb in step):
            mb.old_logprobs = token_logprobs(_logits(model, mb), mb.input_ids[:, 1:], temperature)
            diff_sum += ((mb.old_logprobs - mb.engine_logprobs).abs() * mb.engine_mask).sum()
            diff_count += mb.engine_mask.sum()
            if ref_model is not None and cfg.kl_coef > 0:
                mb.ref_logprobs = token_logprobs(_logits(ref_model, mb), mb.input_ids[:, 1:], temperature)

    eps_high = cfg.eps_clip_high or cfg.eps_clip
    sums = torch.zeros(4, device=device)  # loss, clipped tokens, kl, entropy
    total_tokens, grad_norms, lr = 0.0, [], 0.0
    for step in plan:
        tokens = _all_reduce_sum(sum(mb.mask.sum() for mb in step), world_size)
        total_tokens += float(tokens)
        # Sums over the step's GLOBAL token count make the gradient independent of the
        # micro-batch and rank split; x world_size undoes FSDP's averaging over ranks.
        scale = world_size / tokens.clamp(min=1.0)
        for mb in step:
            logits = _logits(model, mb)
            logp = token_logprobs(logits, mb.input_ids[:, 1:], temperature)
            pg, clipped = ppo_clip_loss(logp, mb.old_logprobs, mb.advantages, mb.mask, cfg.eps_clip, eps_high)
            entropy = (
                entropy_from_logits(logits if cfg.entropy_coef else logits.detach(), temperature) * mb.mask
            ).sum()
            objective = pg - cfg.entropy_coef * entropy
            kl = torch.zeros((), device=device)
            if mb.ref_logprobs is not None:
                kl = kl_k3(logp, mb.ref_logprobs, mb.mask)
                objective = objective + cfg.kl_coef * kl
            (objective * scale).backward()
            sums += torch.stack(
                [objective.detach() / tokens.clamp(min=1.0), clipped, kl.detach(), entropy.detach()]
            )
        grad_norms.append(_clip_grad_norm(model, cfg.grad_clip))
        lr = scheduler.get_last_lr()[0]
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)

    sums = _all_reduce_sum(torch.cat([sums, torch.stack([diff_sum, diff_count])]), world_size).tolist()
    loss, clipped, kl, entropy, diff, count = sums
    per_token = max(total_tokens, 1.0)
    return {
        "loss": loss / len(plan),
        "pg_clipfrac": clipped / per_token,
        "kl": kl / per_token,
        "entropy": entropy / per_token,
        "grad_norm": sum(grad_norms) / len(grad_norms),
        "train_engine_logprob_abs_diff": diff / max(count, 1.0),
        "lr": lr,
        "num_steps": len(plan),
        "response_tokens": int(total_tokens),
    }
