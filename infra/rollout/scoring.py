"""Rewards, group advantages and pass@k over a rollout's samples."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from math import comb

from infra.algorithms.advantages import compute_advantages, stuck_groups, zero_variance_groups
from infra.config import AlgorithmConfig
from infra.data.rewards import score
from infra.rollout.batch import Sample


class TooManyFailedSamples(ValueError):
    """More of a rollout's samples failed than `data.max_failed_fraction` allows."""


def score_samples(
    samples: list[Sample],
    reward_fn: Callable,
    algorithm: AlgorithmConfig | None,
    timeout_s: float | None = None,
) -> None:
    """Fill reward, status and (with `algorithm`) advantage in place.

    A reward that raises or runs past `timeout_s` marks only its sample `failed` with
    reward 0: one bad completion must not stop a training run (`check_failures` stops one
    where most do).
    """
    items = [(s.prompt, s.response, s.label) for s in samples]
    results = score(reward_fn, items, timeout_s=timeout_s, groups=[s.group for s in samples])
    for s, res in zip(samples, results, strict=True):
        s.reward = res.reward
        if res.status == "failed":
            s.status, s.error = "failed", res.error
    if algorithm is not None:
        assign_advantages(samples, algorithm)


def assign_advantages(samples: list[Sample], algorithm: AlgorithmConfig) -> None:
    """The estimator's advantage on every sample (samples without a prompt have no loss tokens).

    ppo has none per sample: its advantages are per token, from the critic's values, computed
    on the trainer (infra/trainer/ppo_targets.py); the samples keep 0.
    """
    if algorithm.advantage_estimator == "ppo":
        return
    advantages = compute_advantages(
        algorithm.advantage_estimator,
        [s.reward for s in samples],
        [s.group for s in samples],
        [s.loss_tokens for s in samples],
        normalize_std=algorithm.normalize_advantage_std,
        unbiased_std=algorithm.unbiased_std,
    )
    for s, a in zip(samples, advantages, strict=True):
        s.advantage = a


def failed_share(samples: list[Sample]) -> float:
    """The share of samples whose reward failed (0 for none)."""
    return sum(s.status == "failed" for s in samples) / len(samples) if samples else 0.0


def check_failures(samples: list[Sample], max_fraction: float, where: str) -> None:
    share = failed_share(samples)
    if share > max_fraction:
        failed = [s for s in samples if s.status == "failed"]
        raise TooManyFailedSamples(
            f"{len(failed)} of {len(samples)} samples failed their reward "
            f"({share:.0%} > data.max_failed_fraction={max_fraction:g}); "
            f"first error: {failed[0].error}; samples with errors: {where}"
        )


def rollout_stats(samples: list[Sample]) -> dict:
    n = len(samples)
    rewards = [s.reward for s in samples]
    mean = sum(rewards) / n
    return {
        "reward_mean": mean,
        "reward_std": (sum((r - mean) ** 2 for r in rewards) / n) ** 0.5,
        "response_len_mean": sum(len(s.response_ids) for s in samples) / n,
        "truncated_frac": sum(s.status == "truncated" for s in samples) / n,
        "reward_failures": sum(s.status == "failed" for s in samples),
        "num_samples": n,
        "zero_variance_group_frac": _flat_share(samples),
        "stuck_group_frac": _stuck_share(samples),
        "weight_version": min(s.weight_version for s in samples),
        "weight_version_max": max(s.weight_version for s in samples),
    }


def _flat_share(samples: list[Sample]) -> float:
    flat, total = zero_variance_groups([s.reward for s in samples], [s.group for s in samples])
    return flat / total


def _stuck_share(samples: list[Sample]) -> float:
    stuck, total = stuck_groups([s.reward for s in samples], [s.group for s in samples])
    return stuck / total


def pass_at_k(samples: list[Sample], k: int) -> float:
    """Unbiased pass@k (Chen et al. 2021) per prompt group, averaged; solved means reward >= 1."""
    groups: dict[int, list[float]] = defaultdict(list)
    for s in samples:
        groups[s.group].append(s.reward)
    total = 0.0
    for rewards in groups.values():
        n, c = len(rewards), sum(r >= 1.0 for r in rewards)
        total += 1.0 if n - c < k else 1.0 - comb(n - c, k) / comb(n, k)
    return total / len(groups)
