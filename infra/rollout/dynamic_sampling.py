"""Dynamic sampling: keep only prompt groups whose rewards differ, sampling again if short.

A group whose rewards all agree has zero group-relative advantage: it costs a forward and
backward and teaches nothing. Dropping it and sampling prompts again (new seeds) keeps every
optimizer step full of groups with signal. Drawing again only the prompts still stuck, not
the solved ones or those with signal, makes the extra rounds cheap once most prompts are
answered right, but leaves more of the batch to zero-advantage fillers (bench/RESULTS.md: it
helps on the single-token tasks and hurts on pair-copy). After the cap on extra rounds,
dropped groups fill what is still missing, so a batch always has its full size (the optimizer
steps stay the same shape).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

from infra.rollout.batch import Sample, renumbered


def _groups(samples: list[Sample]) -> list[list[Sample]]:
    order: dict[int, list[Sample]] = {}
    for s in samples:
        order.setdefault(s.group, []).append(s)
    return list(order.values())


def _varied(group: list[Sample]) -> bool:
    return any(s.reward != group[0].reward for s in group)


def rewards_seen(stats: dict) -> tuple[float, float] | None:
    """The run's reward range that `fill_with_signal`'s stats carry (its next `seen`), or None
    for stats without one (no dynamic sampling)."""
    if "dynamic_sampling_reward_high" not in stats:
        return None
    return stats["dynamic_sampling_reward_low"], stats["dynamic_sampling_reward_high"]


def fill_with_signal(
    draw: Callable[[int, list[int]], list[Sample]],
    num_groups: int,
    max_extra_rounds: int,
    resample: Literal["all", "stuck"] = "all",
    seen: tuple[float, float] | None = None,
) -> tuple[list[Sample], dict]:
    """Call `draw(round, prompts)` (scored samples of those prompt indices, each sample's
    `group` its prompt's position in `prompts`) until `num_groups` groups with signal are found
    or `max_extra_rounds` rounds past the first are spent. Round 0 draws every prompt. An extra
    round draws every prompt again (`all`), or (`stuck`) only the prompts with no group with
    signal yet that scored below the highest reward seen: `seen` is the lowest and highest
    reward of the run's earlier iterations, so a prompt answered right on every sample is not
    drawn again, and while no sample of the run has scored differently from any other, every
    prompt without signal is.

    Returns `num_groups` groups renumbered 0..num_groups-1 (first found first) and stats:
    rounds and samples drawn, groups dropped, flat groups that fill a short batch, the batch's
    mean reward, the run's reward range so far (the next `seen`), and as `reward_mean` the
    first round's, what the policy scores (the batch keeps only groups with signal: its mean
    misreads the policy while most prompts fail or most are solved).
    """
    kept: list[list[Sample]] = []
    flat: list[list[Sample]] = []
    flat_reward: dict[int, float] = {}  # prompts without signal yet: their flat groups' reward
    low, high = seen or (float("inf"), float("-inf"))
    prompts, rounds, drawn_samples, first_round_reward = list(range(num_groups)), 0, 0, 0.0
    while prompts and rounds <= max_extra_rounds and len(kept) < num_groups:
        drawn = draw(rounds, prompts)
        drawn_samples += len(drawn)
        rewards = [s.reward for s in drawn]
        if rounds == 0:
            first_round_reward = sum(rewards) / max(1, len(rewards))
        low, high = min([low, *rewards]), max([high, *rewards])
        for group in _groups(drawn):
            prompt = prompts[group[0].group]
            if _varied(group):
                kept.append(group)
                flat_reward.pop(prompt, None)
            else:
                flat.append(group)
                flat_reward[prompt] = group[0].reward
        if resample == "stuck":
            prompts = [p for p in prompts if p in flat_reward and (low == high or flat_reward[p] < high)]
        rounds += 1
    chosen = kept[:num_groups]
    filled = flat[: num_groups - len(chosen)]
    out = renumbered(chosen + filled)
    stats = {
        "dynamic_sampling_rounds": rounds,
        "dynamic_sampling_samples": drawn_samples,
        "dynamic_sampling_dropped_groups": len(flat) - len(filled),
        "dynamic_sampling_filled_groups": len(filled),
        "dynamic_sampling_batch_reward_mean": sum(s.reward for s in out) / max(1, len(out)),
        "dynamic_sampling_reward_low": low,
        "dynamic_sampling_reward_high": high,
        "reward_mean": first_round_reward,
    }
    return out, stats
