"""Rewards that see several responses at once: a group reward (all samples of one prompt,
for pairwise or ranking rewards) and a batch reward (a whole rollout, e.g. a reward-model
service that scores many samples per request).

Such a function takes `(prompts, responses, labels, **kw)` lists and returns one reward
per item, in order. Mark it with `@group_reward` or `@batch_reward`; an unmarked function
is a per-sample reward `(prompt, response, label, **kw) -> float`.
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Callable, Sequence
from typing import Literal

Scope = Literal["sample", "group", "batch"]


class RewardTimeoutError(TimeoutError):
    pass


def group_reward(fn: Callable) -> Callable:
    """Call `fn` once per prompt group with the group's prompts, responses and labels."""
    fn.reward_scope = "group"
    return fn


def batch_reward(fn: Callable) -> Callable:
    """Call `fn` once per rollout with every sample (it batches or fans out itself)."""
    fn.reward_scope = "batch"
    return fn


def scope_of(fn: Callable) -> Scope:
    return getattr(fn, "reward_scope", "sample")


def _call_list(fn: Callable, items: Sequence[tuple[str, str, str]], kw: dict) -> list[object]:
    """One call over `items`; every item gets the call's error if it fails as a whole."""
    try:
        prompts, responses, labels = (list(col) for col in zip(*items, strict=True))
        values = list(fn(prompts, responses, labels, **kw))
    except Exception as e:
        return [e] * len(items)
    if len(values) != len(items):
        error = ValueError(f"a {scope_of(fn)} reward returned {len(values)} rewards for {len(items)} samples")
        return [error] * len(items)
    return values


def score_lists(
    fn: Callable,
    items: list[tuple[str, str, str]],
    groups: list[int],
    timeout_s: float | None = None,
    **kw,
) -> list[object]:
    """Per-item values (numbers, or the exception that failed the item) of a group or
    batch reward; calls of different groups run concurrently, each within `timeout_s`."""
    if scope_of(fn) == "batch":
        parts = [list(range(len(items)))]
    else:
        by_group: dict[int, list[int]] = {}
        for i, g in enumerate(groups):
            by_group.setdefault(g, []).append(i)
        parts = list(by_group.values())
    values: list[object] = [None] * len(items)
    pool = concurrent.futures.ThreadPoolExecutor(min(8, max(1, len(parts))), "group-reward")
    try:
        futures = {pool.submit(_call_list, fn, [items[i] for i in part], kw): part for part in parts}
        # a reward that times its own calls out (a ProcessReward) is not timed here: a part
        # queued behind busy workers has not started yet
        outer = None if getattr(fn, "enforces_timeout", False) else timeout_s
        done, late = concurrent.futures.wait(futures, timeout=outer)
        for f in done:
            for i, v in zip(futures[f], f.result(), strict=True):
                values[i] = v
        for f in late:
            for i in futures[f]:
                values[i] = RewardTimeoutError(f"reward call exceeded data.reward_timeout_s={timeout_s:g}")
    finally:
        pool.shutdown(wait=False, cancel_futures=True)  # a hung call's thread is abandoned
    return values
