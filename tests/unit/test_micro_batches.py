"""Micro-batch plans: by sample count (contiguous, as before) and by token budget."""

from __future__ import annotations

import random

import pytest

from infra.config import DEFAULT_MICRO_BATCH_TOKENS, AlgorithmConfig, RunConfig
from infra.trainer.micro_batches import plan_by_count, plan_by_tokens


def _padded(mb: list[int], lengths: list[int]) -> int:
    return len(mb) * max(lengths[i] for i in mb)


def test_count_plan_is_contiguous_per_rank():
    plan = plan_by_count(8, world_size=2, global_batch_size=4, micro_batch_size=1)
    assert plan == [[[[0], [1]], [[2], [3]]], [[[4], [5]], [[6], [7]]]]


@pytest.mark.parametrize("world_size", [1, 2, 4])
@pytest.mark.parametrize("budget", [2, 20, 64, 10_000])
def test_token_plan_covers_each_sample_once_with_equal_micro_batch_counts(world_size, budget):
    g = random.Random(budget + world_size)
    lengths = [g.randint(2, 40) for _ in range(48)]
    plan = plan_by_tokens(lengths, world_size, global_batch_size=16, budget=budget)
    assert len(plan) == 3
    for s, step in enumerate(plan):
        assert len(step) == world_size
        # FSDP: every rank runs the same number of forward/backward passes
        assert len({len(rank) for rank in step}) == 1
        # equal sample counts per rank, every sample of the step exactly once
        assert {sum(len(mb) for mb in rank) for rank in step} == {16 // world_size}
        assert sorted(i for rank in step for mb in rank for i in mb) == list(range(16 * s, 16 * s + 16))
        for rank in step:
            for mb in rank:
                assert mb and (len(mb) == 1 or _padded(mb, lengths) <= budget)


def test_token_plan_pads_less_than_count_plan_on_varied_lengths():
    g = random.Random(0)
    lengths = [g.choice([4, 60]) for _ in range(64)]
    by_tokens = plan_by_tokens(lengths, 2, global_batch_size=64, budget=240)
    by_count = plan_by_count(64, 2, global_batch_size=64, micro_batch_size=4)
    padded = [sum(_padded(mb, lengths) for rank in p[0] for mb in rank) for p in (by_tokens, by_count)]
    assert padded[0] < 0.7 * padded[1]
    # short rows share micro-batches: fewer passes than one per 4 samples
    assert len(by_tokens[0][0]) < len(by_count[0][0])


def test_token_plan_balances_tokens_across_ranks():
    lengths = list(range(2, 66))
    step = plan_by_tokens(lengths, 2, global_batch_size=64, budget=128)[0]
    loads = [sum(lengths[i] for mb in rank for i in mb) for rank in step]
    assert abs(loads[0] - loads[1]) <= max(lengths)


def test_a_sample_longer_than_the_budget_runs_alone():
    plan = plan_by_tokens([100, 3, 3, 3], 1, global_batch_size=4, budget=10)
    assert plan == [[[[0], [1, 2, 3]]]]


def test_which_plan_a_config_asks_for():
    """Neither field set: a budget of 16384 tokens; micro_batch_size alone: by count;
    micro_batch_tokens set: by tokens, whatever micro_batch_size says."""
    assert AlgorithmConfig().token_budget == DEFAULT_MICRO_BATCH_TOKENS == 16384
    assert AlgorithmConfig(micro_batch_size=8).token_budget is None
    assert AlgorithmConfig(micro_batch_size=8, micro_batch_tokens=64).token_budget == 64


def test_the_default_budget_trains_the_demo_step_in_one_micro_batch_per_rank():
    """The demo's step (1024 samples: 128 prompts x 8, prompts of a few tokens, one new token)
    on 2 ranks: one forward/backward each, not 16 of 32 samples."""
    cfg = RunConfig()
    samples = cfg.rollout.prompts_per_rollout * cfg.rollout.n_samples_per_prompt
    lengths = [random.Random(i).randint(6, 9) for i in range(samples)]
    plan = plan_by_tokens(lengths, 2, samples, cfg.algorithm.token_budget)
    assert [len(rank) for rank in plan[0]] == [1, 1]
    assert sorted(i for rank in plan[0] for mb in rank for i in mb) == list(range(samples))
