"""Every estimator against values derived by hand (the derivation is in each test)."""

import math

import pytest

from infra.algorithms.advantages import (
    compute_advantages,
    grpo_advantages,
    reinforce_plus_plus_advantages,
    rloo_advantages,
    stuck_groups,
    whiten_over_tokens,
    zero_variance_groups,
)
from infra.config import AlgorithmConfig
from infra.rollout.batch import Sample
from infra.rollout.scoring import assign_advantages

REWARDS = [1.0, 0.0, 0.0, 1.0, 3.0, 5.0]
GROUPS = [0, 0, 0, 0, 1, 1]


def test_grpo_centred_without_std():
    # group 0: mean 0.5 -> +-0.5; group 1: mean 4 -> -1, +1
    adv = grpo_advantages(REWARDS, GROUPS, normalize_std=False)
    assert adv == pytest.approx([0.5, -0.5, -0.5, 0.5, -1.0, 1.0])


def test_grpo_divides_by_unbiased_std_by_default():
    # group 0: mean 0.5, squared deviations 4 x 0.25 = 1, unbiased var 1 / 3, std 1/sqrt(3):
    #   0.5 * sqrt(3) = 0.8660...; group 1: mean 4, var (1 + 1) / 1 = 2, std sqrt(2): -+1/sqrt(2)
    adv = grpo_advantages(REWARDS, GROUPS, normalize_std=True, eps=0.0)
    s3, s2 = math.sqrt(3) / 2, 1 / math.sqrt(2)
    assert adv == pytest.approx([s3, -s3, -s3, s3, -s2, s2])


def test_grpo_population_std_on_request():
    # population var: group 0: 1 / 4 -> std 0.5 -> +-1; group 1: 2 / 2 = 1 -> std 1 -> -+1
    adv = grpo_advantages(REWARDS, GROUPS, normalize_std=True, eps=0.0, unbiased_std=False)
    assert adv == pytest.approx([1.0, -1.0, -1.0, 1.0, -1.0, 1.0])


def test_grpo_eps_added_to_std():
    # mean 1, unbiased std sqrt(((2-1)^2 + (0-1)^2) / 1) = sqrt(2): (2 - 1) / (sqrt(2) + 1)
    adv = grpo_advantages([2.0, 0.0], [7, 7], normalize_std=True, eps=1.0)
    assert adv == pytest.approx([1 / (math.sqrt(2) + 1), -1 / (math.sqrt(2) + 1)])


def test_grpo_identical_rewards_give_exact_zeros():
    assert grpo_advantages([0.7] * 4, [3] * 4, normalize_std=True) == [0.0] * 4
    assert grpo_advantages([0.7] * 4, [3] * 4, normalize_std=False) == [0.0] * 4


def test_grpo_group_of_one_keeps_its_reward():
    # no baseline for a lone sample: mean counts as 0 and std as 1, so A = r / (1 + eps)
    adv = grpo_advantages([1.0, 10.0, 3.0, 20.0, 5.0], [0, 1, 0, 1, 2], normalize_std=True, eps=1e-6)
    assert adv[:4] == pytest.approx(
        [-1 / math.sqrt(2), -1 / math.sqrt(2), 1 / math.sqrt(2), 1 / math.sqrt(2)]
    )
    assert adv[4] == pytest.approx(5.0 / (1 + 1e-6))
    assert grpo_advantages([5.0], [0], normalize_std=False) == [5.0]


def test_rloo_subtracts_the_mean_of_the_others():
    # r=1 in [1,0,0,1]: 1 - mean(0,0,1) = 2/3; r=0: 0 - mean(1,0,1) = -2/3
    # group [3,5]: 3 - 5 = -2, 5 - 3 = 2; a lone sample keeps its reward
    adv = rloo_advantages([*REWARDS, 4.0], [*GROUPS, 9])
    assert adv == pytest.approx([2 / 3, -2 / 3, -2 / 3, 2 / 3, -2.0, 2.0, 4.0])


def test_reinforce_plus_plus_whitens_over_tokens():
    # tokens: sample 0 has 1 token with return 1, sample 1 has 3 with return 0, sample 2 none.
    # mean over 4 tokens = 1/4; var = (1 x 0.75^2 + 3 x 0.25^2) / (4 - 1) = 0.75 / 3 = 0.25
    # A = (r - 0.25) / sqrt(0.25 + 1e-8): 1.5, -0.5; no tokens -> 0
    adv = reinforce_plus_plus_advantages([1.0, 0.0, 2.0], [1, 3, 0])
    assert adv == pytest.approx([0.75 / math.sqrt(0.25 + 1e-8), -0.25 / math.sqrt(0.25 + 1e-8), 0.0])


def test_reinforce_plus_plus_baseline_centres_groups_first():
    # centred: [0.5, -0.5 | -1, 1]; tokens (2, 2, 1, 1): mean (1 - 1 - 1 + 1) / 6 = 0,
    # var (2 x 0.25 + 2 x 0.25 + 1 + 1) / 5 = 0.6
    adv = reinforce_plus_plus_advantages([1.0, 0.0, 3.0, 5.0], [2, 2, 1, 1], [0, 0, 1, 1])
    d = math.sqrt(0.6 + 1e-8)
    assert adv == pytest.approx([0.5 / d, -0.5 / d, -1 / d, 1 / d])


def test_whitening_needs_two_tokens():
    assert whiten_over_tokens([3.0, 1.0], [1, 0]) == [0.0, 0.0]


def test_dispatch():
    lengths = [1] * 6
    assert compute_advantages("dr_grpo", REWARDS, GROUPS, lengths) == grpo_advantages(
        REWARDS, GROUPS, normalize_std=False
    )
    assert compute_advantages("gspo", REWARDS, GROUPS, lengths) == grpo_advantages(
        REWARDS, GROUPS, normalize_std=True
    )
    assert compute_advantages("rloo", REWARDS, GROUPS, lengths) == rloo_advantages(REWARDS, GROUPS)
    with pytest.raises(ValueError, match="ppo"):
        compute_advantages("ppo", REWARDS, GROUPS, lengths)


def test_zero_variance_groups_counted():
    # group 0 varies, group 1 agrees, group 2 is a lone sample (not "flat": nothing to compare)
    assert zero_variance_groups([1.0, 0.0, 2.0, 2.0, 5.0], [0, 0, 1, 1, 2]) == (1, 3)


def test_stuck_groups_are_flat_below_the_best_reward():
    # group 0 varies, group 1 is flat at the best reward (solved), group 2 flat below it (stuck),
    # group 3 a lone sample
    rewards, groups = [1.0, 0.0, 1.0, 1.0, 0.5, 0.5, 0.0], [0, 0, 1, 1, 2, 2, 3]
    assert stuck_groups(rewards, groups) == (1, 4)
    # nothing is stuck when every group is flat at the same reward: no better answer was seen
    assert stuck_groups([0.0, 0.0, 0.0, 0.0], [0, 0, 1, 1]) == (0, 2)


def test_length_mismatch_raises():
    with pytest.raises(ValueError):
        grpo_advantages([1.0], [0, 1], normalize_std=True)


def _scored(lengths: list[int]) -> list[Sample]:
    return [
        Sample("p", "a", "r", [1], [2] * n, [0.0] * n, 0, g, reward=r)
        for r, g, n in zip(REWARDS, GROUPS, lengths, strict=True)
    ]


def test_dr_grpo_from_the_config_never_divides_by_std():
    # normalize_advantage_std is on by default; Dr. GRPO ignores it: group-centred rewards only
    samples = _scored([1] * 6)
    assign_advantages(samples, AlgorithmConfig(advantage_estimator="dr_grpo", normalize_advantage_std=True))
    assert [s.advantage for s in samples] == pytest.approx([0.5, -0.5, -0.5, 0.5, -1.0, 1.0])


def test_reinforce_plus_plus_baseline_from_the_config():
    lengths = [2, 1, 3, 2, 1, 1]
    samples = _scored(lengths)
    assign_advantages(samples, AlgorithmConfig(advantage_estimator="reinforce_plus_plus_baseline"))
    # centred per group: [0.5, -0.5, -0.5, 0.5 | -1, 1]; then whitened over the 10 tokens:
    # mean (1 - 0.5 - 1.5 + 1 - 1 + 1) / 10 = 0, unbiased var (0.5 + 0.25 + 0.75 + 0.5 + 1 + 1) / 9
    centred = [0.5, -0.5, -0.5, 0.5, -1.0, 1.0]
    d = math.sqrt(4 / 9 + 1e-8)
    assert [s.advantage for s in samples] == pytest.approx([c / d for c in centred])
