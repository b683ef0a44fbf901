"""The learning summary bench.seed_robustness and bench.engine_learning print."""

from __future__ import annotations

import inspect

from bench import engine_learning
from bench.seed_robustness import summarize


def _rows(evals: dict[int, float]) -> list[dict]:
    rows = [{"rollout_id": i, "reward_mean": i / 100} for i in range(100)]
    for i, value in evals.items():
        rows[i]["eval_reward_mean"] = value
    return rows


def test_best_before_the_window_and_lowest_after_it():
    res = summarize(_rows({9: 0.5, 49: 0.95, 69: 0.6, 99: 0.9}), 0.9, within=60)
    assert res["eval_target_iter"] == 49 and res["eval_0.8_iter"] == 49
    assert (res["best_eval_within"], res["min_eval_after"]) == (0.95, 0.6)
    assert res["reward_target_iter"] == 90 and res["final_eval"] == 0.9


def test_summarize_takes_the_call_engine_learning_makes():
    """bench.engine_learning passes rows and target only: the window has a default (60)."""
    assert "summarize(rows, args.target)" in inspect.getsource(engine_learning.main)
    assert inspect.signature(summarize).bind([], 0.9).arguments == {"rows": [], "target": 0.9}
