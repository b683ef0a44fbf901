import math

import pytest

from infra.trainer.advantages import grpo_advantages


def test_centred_without_std():
    adv = grpo_advantages([1.0, 0.0, 0.0, 1.0, 3.0, 5.0], [0, 0, 0, 0, 1, 1], normalize_std=False)
    assert adv == pytest.approx([0.5, -0.5, -0.5, 0.5, -1.0, 1.0])


def test_normalized_by_population_std():
    # group 0: mean 0.5, population std 0.5; group 1: mean 4, population std 1 (sample std would be sqrt 2)
    adv = grpo_advantages([1.0, 0.0, 0.0, 1.0, 3.0, 5.0], [0, 0, 0, 0, 1, 1], normalize_std=True, eps=0.0)
    assert adv == pytest.approx([1.0, -1.0, -1.0, 1.0, -1.0, 1.0])


def test_eps_added_to_std():
    adv = grpo_advantages([2.0, 0.0], [7, 7], normalize_std=True, eps=1.0)
    assert adv == pytest.approx([0.5, -0.5])  # (2 - 1) / (1 + 1)


def test_identical_rewards_give_zeros():
    assert grpo_advantages([0.7] * 4, [3] * 4, normalize_std=True) == [0.0] * 4
    assert grpo_advantages([0.7] * 4, [3] * 4, normalize_std=False) == [0.0] * 4


def test_interleaved_groups_and_singletons():
    adv = grpo_advantages([1.0, 10.0, 3.0, 20.0, 5.0], [0, 1, 0, 1, 2], normalize_std=True, eps=0.0)
    assert adv[:4] == pytest.approx([-1.0, -1.0, 1.0, 1.0])
    assert adv[4] == 0.0 and not math.isnan(adv[4])


def test_length_mismatch_raises():
    with pytest.raises(ValueError):
        grpo_advantages([1.0], [0, 1], normalize_std=True)
