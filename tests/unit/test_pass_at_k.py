"""pass@k against the unbiased estimator 1 - C(n-c, k) / C(n, k), computed here on its own."""

from math import comb

import pytest

from infra.rollout.batch import Sample
from infra.rollout.scoring import pass_at_k


def group(index: int, n: int, c: int) -> list[Sample]:
    """`n` samples of prompt `index`, the first `c` solved (reward 1), the rest not (reward 0)."""
    return [Sample("p", "a", "r", [1], [2], [0.0], 0, index, reward=1.0 if i < c else 0.0) for i in range(n)]


def estimator(n: int, c: int, k: int) -> float:
    # the probability that k draws without replacement from n include a solved one
    unsolved = 1.0
    for i in range(k):
        unsolved *= (n - c - i) / (n - i)
    return 1.0 - max(unsolved, 0.0)


@pytest.mark.parametrize(
    ("n", "c", "k"),
    [
        (4, 0, 1),  # none solved
        (4, 0, 4),
        (4, 4, 1),  # all solved
        (4, 4, 4),
        (4, 1, 1),
        (4, 1, 2),
        (4, 1, 4),  # k = n: solved at all
        (8, 3, 2),
        (8, 3, 5),  # n - c = k: exactly one draw of k misses them all
        (8, 3, 6),  # n - c < k: every draw of k holds a solved one
        (10, 7, 3),
    ],
)
def test_one_group_matches_the_estimator(n, c, k):
    expected = 1.0 - comb(n - c, k) / comb(n, k)
    assert pass_at_k(group(0, n, c), k) == pytest.approx(expected, abs=1e-12)
    # the product form agrees with the binomial form: the expected values are not circular
    assert estimator(n, c, k) == pytest.approx(expected, abs=1e-12)


def test_known_values():
    assert pass_at_k(group(0, 4, 1), 1) == pytest.approx(0.25)
    assert pass_at_k(group(0, 4, 1), 2) == pytest.approx(0.5)  # 1 - C(3,2)/C(4,2) = 1 - 3/6
    assert pass_at_k(group(0, 8, 3), 2) == pytest.approx(1 - 10 / 28)
    assert pass_at_k(group(0, 4, 0), 4) == 0.0
    assert pass_at_k(group(0, 4, 4), 1) == 1.0


def test_mixed_groups_average_over_prompts():
    shapes = [(4, 0), (4, 1), (4, 2), (4, 4), (6, 5)]  # (n, c) per prompt, unequal n included
    samples = [s for i, (n, c) in enumerate(shapes) for s in group(i, n, c)]
    for k in (1, 2, 4):
        expected = sum(estimator(n, c, k) for n, c in shapes) / len(shapes)
        assert pass_at_k(samples, k) == pytest.approx(expected, abs=1e-12)
    # the mean over prompts, not over samples: a 6-sample group weighs as much as a 4-sample one
    assert pass_at_k(samples, 1) == pytest.approx((0 + 0.25 + 0.5 + 1 + 5 / 6) / 5)


def test_interleaved_samples_are_grouped_by_prompt():
    samples = group(0, 4, 1) + group(1, 4, 3)
    shuffled = [samples[i] for i in (0, 4, 1, 5, 2, 6, 3, 7)]
    assert pass_at_k(shuffled, 2) == pytest.approx((0.5 + 1.0) / 2)


def test_solved_means_reward_at_least_one():
    samples = group(0, 4, 0)
    samples[0].reward, samples[1].reward = 0.99, 1.5  # a partial credit does not count; above 1 does
    assert pass_at_k(samples, 1) == pytest.approx(0.25)
