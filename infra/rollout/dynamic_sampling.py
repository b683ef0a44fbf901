"""Dynamic sampling: keep only prompt groups whose rewards differ, sampling again if short.

A group whose rewards all agree has zero group-relative advantage: it costs a forward and
backward and teaches nothing. Dropping it and sampling the batch's prompts again (new
seeds) keeps every optimizer step full of groups with signal. After the cap on extra
rounds, dropped groups fill what is still missing, so a batch always has its full size
(the optimizer steps stay the same shape).
"""

from __future__ import annotations

from collections.abc import Callable

from infra.rollout.batch import Sample


def _groups(samples: list[Sample]) -> list[list[Sample]]:
    order: dict[int, list[Sample]] = {}
    for s in samples:
        order.setdefault(s.group, []).append(s)
    return list(order.values())


def _varied(group: list[Sample]) -> bool:
    return any(s.reward != group[0].reward for s in group)


def fill_with_signal(
    draw: Callable[[int], list[Sample]], num_groups: int, max_extra_rounds: int
) -> tuple[list[Sample], dict]:
    """Call `draw(round)` (scored samples) until `num_groups` groups with signal are found
    or `max_extra_rounds` rounds past the first are spent.

    Returns `num_groups` groups renumbered 0..num_groups-1 (first found first) and stats:
    rounds drawn, zero-variance groups dropped, dropped groups used to fill a short batch, the
    returned batch's mean reward, and as `reward_mean` the first round's: what the policy
    scores on the prompts (the batch keeps only groups whose rewards differ: its mean is
    higher while most prompts fail and lower once most are solved).
    """
    kept: list[list[Sample]] = []
    flat: list[list[Sample]] = []
    rounds = 0
    first_round_reward = 0.0
    while rounds <= max_extra_rounds and len(kept) < num_groups:
        drawn = draw(rounds)
        if rounds == 0:
            first_round_reward = sum(s.reward for s in drawn) / max(1, len(drawn))
        for group in _groups(drawn):
            (kept if _varied(group) else flat).append(group)
        rounds += 1
    chosen = kept[:num_groups]
    filled = flat[: num_groups - len(chosen)]
    out = []
    for g, group in enumerate(chosen + filled):
        for s in group:
            s.group = g
            out.append(s)
    stats = {
        "dynamic_sampling_rounds": rounds,
        "dynamic_sampling_dropped_groups": len(flat) - len(filled),
        "dynamic_sampling_filled_groups": len(filled),
        "dynamic_sampling_batch_reward_mean": sum(s.reward for s in out) / max(1, len(out)),
        "reward_mean": first_round_reward,
    }
    return out, stats
