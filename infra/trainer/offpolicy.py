"""Before the policy steps: the old policy's logprobs, and what they say about the rollout.

The PPO ratio's denominator comes from the trainer's own forward, not from the engine
(its numerics differ). In async mode that forward runs with weights one step newer than
the engine's that sampled, so the ratio starts at exactly 1 and says nothing about the
staleness; truncated importance sampling (TIS) weights each token's loss by
min(pi_old / pi_engine, cap) to correct for it. The engine/trainer gap is reported on the
samples generated with the trainer's own weights only, so that it measures numerics and
not staleness.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from infra.config import AlgorithmConfig
from infra.rollout.batch import Sample
from infra.trainer.advantages import compute_advantages
from infra.trainer.batches import MicroBatch, all_reduce_max, all_reduce_sum, logits_of
from infra.trainer.losses import LOG_RATIO_CLAMP, kl_penalty, tis_weights, token_logprobs
from infra.trainer.ppo_targets import (
    as_lists,
    from_lists,
    ppo_targets,
    response_width,
    to_positions,
    to_response,
)

# Rank 0 of the actor hands the critic its per-token KL (response coordinates, plain lists).
PublishKL = Callable[[list[list[float]]], None]


def _staleness(samples: list[Sample], rollout_id: int | None) -> dict:
    if rollout_id is None:
        return {}
    lags = [rollout_id - s.weight_version for s in samples]
    return {"staleness_mean": sum(lags) / len(lags), "staleness_max": max(lags)}


def _kl_in_reward(
    plan: list[list[MicroBatch]], samples: list[Sample], cfg: AlgorithmConfig, world_size: int
) -> dict:
    """reward - kl_coef x (summed KL of the old policy to the reference), then the advantages again."""
    device = plan[0][0].mask.device
    seq_kl = torch.zeros(len(samples), device=device)
    for mb in (mb for step in plan for mb in step):  # each rank fills the rows it holds
        kl = kl_penalty(mb.old_logprobs, mb.ref_logprobs, cfg.kl_type)
        seq_kl[mb.index] = (kl * mb.mask).sum(-1)
    seq_kl = all_reduce_sum(seq_kl, world_size).tolist()
    rewards = [s.reward - cfg.kl_coef * k for s, k in zip(samples, seq_kl, strict=True)]
    advantages = compute_advantages(
        cfg.advantage_estimator,
        rewards,
        [s.group for s in samples],
        [len(s.response_ids) if s.prompt_ids else 0 for s in samples],
        normalize_std=cfg.normalize_advantage_std,
        unbiased_std=cfg.unbiased_std,
    )
    for mb in (mb for step in plan for mb in step):
        mb.advantages = torch.tensor([[advantages[i]] for i in mb.index], device=device)
    return {"kl_reward_penalty": cfg.kl_coef * sum(seq_kl) / len(seq_kl)}


def _ppo_advantages(
    plan: list[list[MicroBatch]],
    samples: list[Sample],
    cfg: AlgorithmConfig,
    world_size: int,
    values: list[list[float]],
    publish_kl: PublishKL | None,
) -> dict:
    """Per-token GAE advantages from the critic's values (and, kl_in_reward, the KL per token)."""
    device = plan[0][0].mask.device
    kl = None
    if cfg.kl_in_reward:
        kl = torch.zeros(len(samples), response_width(samples), device=device)
        for mb in (mb for step in plan for mb in step):  # each rank fills the rows it holds
            to_response(kl_penalty(mb.old_logprobs, mb.ref_logprobs, cfg.kl_type) * mb.mask, mb, samples, kl)
        kl = all_reduce_sum(kl, world_size)
        if publish_kl is not None:
            publish_kl(as_lists(kl, samples))
    advantages, _ = ppo_targets(
        samples, from_lists(values, samples, device), cfg.gamma, cfg.lam, kl, cfg.kl_coef
    )
    for mb in (mb for step in plan for mb in step):
        mb.advantages = to_positions(advantages, mb, samples)
    if kl is None:
        return {}
    return {"kl_reward_penalty": cfg.kl_coef * float(kl.sum()) / len(samples)}


def prepare_old_policy(
    model: nn.Module,
    ref_model: nn.Module | None,
    plan: list[list[MicroBatch]],
    samples: list[Sample],
    cfg: AlgorithmConfig,
    temperature: float,
    world_size: int,
    *,
    tis: bool,
    rollout_id: int | None,
    values: list[list[float]] | None = None,
    publish_kl: PublishKL | None = None,
) -> dict:
    """Fill old (and reference) logprobs and TIS weights on every micro-batch; return metrics.

    ppo: `values` are the critic's values of the rollout (response coordinates); the
    micro-batches get per-token GAE advantages, and `publish_kl` (rank 0) receives the
    per-token KL the critic's returns need when the KL is in the reward.
    """
    device = plan[0][0].mask.device
    # fresh |diff| sum, fresh tokens, stale |diff| sum, stale tokens, tis w sum, tis tokens, tis capped
    sums = torch.zeros(7, device=device)
    tis_max = torch.zeros(1, device=device)
    with torch.no_grad():
        for mb in (mb for step in plan for mb in step):
            mb.old_logprobs = token_logprobs(logits_of(model, mb), mb.input_ids[:, 1:], temperature)
            if ref_model is not None and cfg.kl_coef > 0:
                mb.ref_logprobs = token_logprobs(logits_of(ref_model, mb), mb.input_ids[:, 1:], temperature)
            fresh = torch.tensor(
                [float(rollout_id is None or samples[i].weight_version == rollout_id) for i in mb.index],
                device=device,
            ).unsqueeze(-1)
            diff = (mb.old_logprobs - mb.engine_logprobs).abs() * mb.engine_mask
            sums[0] += (diff * fresh).sum()
            sums[1] += (mb.engine_mask * fresh).sum()
            sums[2] += (diff * (1 - fresh)).sum()
            sums[3] += (mb.engine_mask * (1 - fresh)).sum()
            if tis:
                missing = ((mb.mask > 0) & (mb.engine_mask == 0)).any(-1).nonzero().flatten().tolist()
                if missing:
                    raise ValueError(
                        f"algorithm.tis is on but sample {mb.index[missing[0]]} lacks engine logprobs for "
                        "its response; set algorithm.tis=off or have the engines return logprobs"
                    )
                mb.tis_weights = tis_weights(mb.old_logprobs, mb.engine_logprobs, cfg.tis_cap) * mb.mask
                log_w = (mb.old_logprobs - mb.engine_logprobs).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
                sums[4] += mb.tis_weights.sum()
                sums[5] += mb.mask.sum()
                sums[6] += ((log_w.exp() > cfg.tis_cap).float() * mb.mask).sum()
                tis_max = torch.maximum(tis_max, (mb.tis_weights.max()).reshape(1))
    s = all_reduce_sum(sums, world_size).tolist()
    metrics = {
        **_staleness(samples, rollout_id),
        # same weights on both sides: the engine/trainer numeric gap alone
        "train_engine_logprob_abs_diff": s[0] / max(s[1], 1.0),
        "train_engine_logprob_tokens": int(s[1]),
        # samples from older weights: numerics plus staleness
        "train_engine_logprob_abs_diff_stale": s[2] / max(s[3], 1.0),
        "train_engine_logprob_tokens_stale": int(s[3]),
    }
    if tis:
        metrics.update(
            tis_weight_mean=s[4] / max(s[5], 1.0),
            tis_weight_max=float(all_reduce_max(tis_max, world_size)),
            tis_capped_frac=s[6] / max(s[5], 1.0),
        )
    if cfg.kl_in_reward and ref_model is None:
        raise ValueError("algorithm.kl_in_reward needs the reference model (algorithm.kl_coef > 0)")
    if cfg.advantage_estimator == "ppo":
        if values is None:
            raise ValueError("algorithm.advantage_estimator=ppo: the actor got no values from the critic")
        metrics.update(_ppo_advantages(plan, samples, cfg, world_size, values, publish_kl))
    elif cfg.kl_in_reward:
        metrics.update(_kl_in_reward(plan, samples, cfg, world_size))
    return metrics
