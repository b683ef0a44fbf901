import math

import pytest

from infra.trainer.lr_schedule import lr_factor


def f(step, kind, warmup=2, total=12, min_ratio=0.0):
    return lr_factor(step, warmup=warmup, total=total, kind=kind, min_ratio=min_ratio)


def test_warmup_is_linear_from_the_first_step():
    assert [f(s, "constant") for s in range(4)] == [0.5, 1.0, 1.0, 1.0]


def test_linear_decay_reaches_min_at_the_last_step():
    # after 2 warm-up steps, 12 - 1 - 2 = 9 steps from 1 to 0.1: step 2 -> 1, step 11 -> 0.1
    assert f(2, "linear", min_ratio=0.1) == pytest.approx(1.0)
    assert f(11, "linear", min_ratio=0.1) == pytest.approx(0.1)
    assert f(6, "linear", min_ratio=0.1) == pytest.approx(0.1 + 0.9 * (1 - 4 / 9))
    assert f(50, "linear", min_ratio=0.1) == pytest.approx(0.1)


def test_cosine_decay():
    # halfway (progress 1/2): 0.5 (1 + cos(pi/2)) = 0.5
    assert f(2 + 4, "cosine", total=11) == pytest.approx(0.5)
    assert f(2 + 2, "cosine", total=11) == pytest.approx(0.5 * (1 + math.cos(math.pi / 4)))
    assert f(10, "cosine", total=11) == pytest.approx(0.0, abs=1e-12)


def test_unknown_kind():
    with pytest.raises(ValueError, match="lr_schedule"):
        f(5, "step")
