"""Outcome advantages: one number per response, from its reward and its prompt group.

Plain Python on purpose: the rollout manager computes advantages and must not import
torch just for this. Every estimator here sees only scalar outcome rewards (one per
response); the per-token discounted return of an outcome reward with gamma = 1 is that
same number at every token, so one scalar per sample is exact.
"""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Literal

Estimator = Literal[
    "grpo", "dr_grpo", "rloo", "reinforce_plus_plus", "reinforce_plus_plus_baseline", "gspo", "ppo"
]
# Added to the variance before the square root when whitening over tokens (REINFORCE++).
WHITEN_EPS = 1e-8
# Added to the token count a masked mean divides by (verl's masked_mean), so that the
# whitened advantages equal verl's to the last bits.
MASKED_MEAN_EPS = 1e-8


def _groups(values: list[float], groups: list[int]) -> dict[int, list[float]]:
    if len(values) != len(groups):
        raise ValueError(f"rewards ({len(values)}) and groups ({len(groups)}) differ in length")
    members: dict[int, list[float]] = defaultdict(list)
    for value, group in zip(values, groups, strict=True):
        members[group].append(value)
    return members


def grpo_advantages(
    rewards: list[float],
    groups: list[int],
    normalize_std: bool,
    eps: float = 1e-6,
    unbiased_std: bool = True,
) -> list[float]:
    """Reward minus its group's mean, divided by (group std + eps) when `normalize_std`.

    The std is the unbiased sample std (divide by n - 1) by default, as verl and TRL
    compute it; `unbiased_std=False` divides by n. A group of one sample has no baseline:
    its mean counts as 0 and its std as 1, so its advantage is its reward (divided by
    1 + eps), as in verl. A group of identical rewards (n > 1) gives exact zeros, whatever
    the rounding of its mean.
    """
    stats = {}
    for group, values in _groups(rewards, groups).items():
        n = len(values)
        if n == 1:
            stats[group] = (0.0, 1.0, False)
            continue
        mean = sum(values) / n
        var = sum((v - mean) ** 2 for v in values) / (n - 1 if unbiased_std else n)
        stats[group] = (mean, math.sqrt(var), all(v == values[0] for v in values))
    out = []
    for reward, group in zip(rewards, groups, strict=True):
        mean, std, constant = stats[group]
        if constant:
            out.append(0.0)
        else:
            out.append((reward - mean) / (std + eps) if normalize_std else reward - mean)
    return out


def rloo_advantages(rewards: list[float], groups: list[int]) -> list[float]:
    """Reward minus the mean of the OTHER samples of its group: n / (n - 1) * (r - group mean).

    A group of one sample has no other sample: its advantage is its reward (verl's rule).
    """
    members = _groups(rewards, groups)
    out = []
    for reward, group in zip(rewards, groups, strict=True):
        values = members[group]
        n = len(values)
        out.append(reward if n == 1 else (reward - sum(values) / n) * n / (n - 1))
    return out


def whiten_over_tokens(scores: list[float], lengths: list[int]) -> list[float]:
    """(score - mu) / sqrt(var + 1e-8), mu and var taken over loss TOKENS, not samples.

    Each sample's score stands for every one of its `lengths[i]` tokens in the loss (tokens
    the environment wrote are not among them), so a long response weighs more in mu and var;
    var is unbiased over the token count N. As verl's `masked_whiten`, both means divide by
    N + 1e-8 (its `masked_mean`). Samples without tokens are masked out of the loss: they
    get 0. Fewer than 2 tokens in the whole batch: no variance is defined, every advantage is 0.
    """
    if len(scores) != len(lengths):
        raise ValueError(f"scores ({len(scores)}) and lengths ({len(lengths)}) differ in length")
    total = sum(lengths)
    if total < 2:
        return [0.0] * len(scores)
    mean = sum(s * n for s, n in zip(scores, lengths, strict=True)) / (total + MASKED_MEAN_EPS)
    square = sum(n * (s - mean) ** 2 for s, n in zip(scores, lengths, strict=True)) / (
        total + MASKED_MEAN_EPS
    )
    var = square * total / (total - 1)
    scale = 1.0 / math.sqrt(var + WHITEN_EPS)
    return [(s - mean) * scale if n else 0.0 for s, n in zip(scores, lengths, strict=True)]


def reinforce_plus_plus_advantages(
    rewards: list[float], lengths: list[int], groups: list[int] | None = None
) -> list[float]:
    """REINFORCE++: returns whitened over the batch's loss tokens (gamma = 1, outcome rewards);
    `lengths` counts each sample's tokens in the loss.

    With `groups`, the `_baseline` variant: each reward first loses its group's mean (a
    group of one keeps its reward), then the batch is whitened.
    """
    scores = list(rewards)
    if groups is not None:
        members = _groups(rewards, groups)
        means = {g: (sum(v) / len(v) if len(v) > 1 else 0.0) for g, v in members.items()}
        scores = [r - means[g] for r, g in zip(rewards, groups, strict=True)]
    return whiten_over_tokens(scores, lengths)


def compute_advantages(
    estimator: Estimator,
    rewards: list[float],
    groups: list[int],
    lengths: list[int],
    *,
    normalize_std: bool = True,
    unbiased_std: bool = True,
) -> list[float]:
    """The advantage of every sample under `estimator` (`ppo` needs a critic: not here).

    `lengths` are the samples' tokens in the loss (`Sample.loss_tokens`): REINFORCE++
    whitens over them."""
    if estimator in ("grpo", "gspo"):  # GSPO changes the ratio (loss side), not the advantage
        return grpo_advantages(rewards, groups, normalize_std, unbiased_std=unbiased_std)
    if estimator == "dr_grpo":  # Dr. GRPO drops the std division (and the length norm: loss side)
        return grpo_advantages(rewards, groups, normalize_std=False)
    if estimator == "rloo":
        return rloo_advantages(rewards, groups)
    if estimator == "reinforce_plus_plus":
        return reinforce_plus_plus_advantages(rewards, lengths)
    if estimator == "reinforce_plus_plus_baseline":
        return reinforce_plus_plus_advantages(rewards, lengths, groups)
    raise ValueError(f"algorithm.advantage_estimator={estimator!r} has no outcome-only advantage")


def _flat(rewards: list[float]) -> bool:
    """A group of 2+ samples whose rewards all agree."""
    return len(rewards) > 1 and all(x == rewards[0] for x in rewards)


def zero_variance_groups(rewards: list[float], groups: list[int]) -> tuple[int, int]:
    """(groups of 2+ samples whose rewards all agree, all groups): such groups carry no signal."""
    members = _groups(rewards, groups)
    return sum(1 for v in members.values() if _flat(v)), len(members)


def stuck_groups(rewards: list[float], groups: list[int]) -> tuple[int, int]:
    """(flat groups below the batch's best reward, all groups): no signal and not solved.

    A flat group at the best reward is solved; one below it is a prompt the policy fails the
    same way every time: stuck, unless sampling finds a better answer."""
    members = _groups(rewards, groups)
    best = max(rewards, default=0.0)
    return sum(1 for v in members.values() if _flat(v) and v[0] < best), len(members)
