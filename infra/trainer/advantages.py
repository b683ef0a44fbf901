"""GRPO advantages: each reward measured against the other samples of its prompt.

Plain Python on purpose: the rollout manager computes advantages and must not import
torch just for this.
"""

from __future__ import annotations

import math
from collections import defaultdict


def grpo_advantages(
    rewards: list[float], groups: list[int], normalize_std: bool, eps: float = 1e-6
) -> list[float]:
    """Reward minus its group's mean, divided by (group std + eps) when `normalize_std`.

    The std is the population std (divide by n, not n - 1), as in DeepSeek's GRPO and
    TRL: a group of identical rewards then gives exactly zero advantages, and a group of
    one sample is well defined (advantage 0).
    """
    if len(rewards) != len(groups):
        raise ValueError(f"rewards ({len(rewards)}) and groups ({len(groups)}) differ in length")
    members: dict[int, list[float]] = defaultdict(list)
    for reward, group in zip(rewards, groups, strict=True):
        members[group].append(reward)
    stats = {}
    for group, values in members.items():
        mean = sum(values) / len(values)
        std = math.sqrt(sum((v - mean) ** 2 for v in values) / len(values))
        stats[group] = (mean, std)
    out = []
    for reward, group in zip(rewards, groups, strict=True):
        mean, std = stats[group]
        if std == 0.0:  # identical rewards carry no signal; exact zeros, whatever the rounding of the mean
            out.append(0.0)
        else:
            out.append((reward - mean) / (std + eps) if normalize_std else reward - mean)
    return out
