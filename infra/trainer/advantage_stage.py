"""The advantages the policy loss trains on, set on each micro-batch once the old and the
reference logprobs are known: the samples' own scalars, those recomputed with the KL in the
reward, or ppo's per-token GAE advantages from the critic's values. (The estimators
themselves are in infra/algorithms/advantages.py and infra/trainer/ppo_targets.py.)
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from infra.algorithms.advantages import compute_advantages
from infra.config import AlgorithmConfig
from infra.rollout.batch import Sample
from infra.trainer.batches import MicroBatch, all_reduce_sum
from infra.trainer.losses import kl_penalty, mean_sequence_kl
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


def set_advantages(
    plan: list[list[MicroBatch]],
    samples: list[Sample],
    cfg: AlgorithmConfig,
    world_size: int,
    *,
    values: list[list[float]] | None = None,
    publish_kl: PublishKL | None = None,
) -> dict:
    """Set the micro-batches' advantages where the samples' own do not do; returns their metrics.

    ppo: `values` are the critic's values of the rollout (response coordinates); the
    micro-batches get per-token GAE advantages, and `publish_kl` (rank 0) receives the
    per-token KL the critic's returns need when the KL is in the reward.
    """
    if cfg.advantage_estimator == "ppo":
        if values is None:
            raise ValueError("algorithm.advantage_estimator=ppo: the actor got no values from the critic")
        return _ppo_advantages(plan, samples, cfg, world_size, values, publish_kl)
    if cfg.kl_in_reward:
        return _kl_in_reward(plan, samples, cfg, world_size)
    return {}


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
        [s.loss_tokens for s in samples],
        normalize_std=cfg.normalize_advantage_std,
        unbiased_std=cfg.unbiased_std,
    )
    for mb in (mb for step in plan for mb in step):
        mb.advantages = torch.tensor([[advantages[i]] for i in mb.index], device=device)
    return _penalty_metrics(torch.tensor(seq_kl), samples, cfg)


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
    return _penalty_metrics(kl.sum(-1).cpu(), samples, cfg)


def _penalty_metrics(seq_kl: torch.Tensor, samples: list[Sample], cfg: AlgorithmConfig) -> dict:
    """The KL-in-reward metrics under verl's names (apply_kl_penalty's): the mean per-token KL of
    a sequence, averaged over the rollout, and the coefficient it was weighted by."""
    tokens = torch.tensor([s.loss_tokens for s in samples], dtype=seq_kl.dtype)
    return {"reward_kl_penalty": mean_sequence_kl(seq_kl, tokens), "reward_kl_penalty_coeff": cfg.kl_coef}
