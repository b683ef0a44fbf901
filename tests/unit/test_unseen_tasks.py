"""bench/unseen_tasks.py writes the tasks the seed-robustness table reports: they must be
what their docstring says, and learnable only by reading the prompt."""

import json

import pytest

from bench.seed_robustness import summarize
from bench.unseen_tasks import SIZE, TASKS, best_constant_score, task_rows, write_task
from infra.model.tiny import CHARACTERS


@pytest.mark.parametrize("name", sorted(TASKS))
def test_tasks_are_fixed_distinct_single_token_and_need_the_prompt(name, tmp_path):
    rows = task_rows(name)
    assert rows == task_rows(name)  # the same file on every machine
    assert len({r["prompt"] for r in rows}) == SIZE
    assert all(len(r["label"]) == 1 and set(r["prompt"] + r["label"]) <= set(CHARACTERS) for r in rows)
    assert best_constant_score(rows) <= 0.3
    written = [json.loads(line) for line in write_task(name, tmp_path).read_text().splitlines()]
    assert written == rows


def test_answers_follow_the_rules():
    assert all(r["label"] == r["prompt"][int(r["prompt"][-1])] for r in task_rows("pick-digit"))
    assert all(r["label"] == max(r["prompt"][:3]) for r in task_rows("max-digit"))
    assert all(ord(r["label"]) == ord(r["prompt"][0]) + 1 for r in task_rows("next-letter"))


def test_summary_finds_the_target_the_early_best_and_a_later_collapse():
    rows = [{"rollout_id": k, "reward_mean": k / 10} for k in range(10)]
    for k, acc in [(1, 0.5), (3, 0.85), (5, 0.95), (7, 0.6), (9, 0.7)]:
        rows[k]["eval_reward_mean"] = acc
    res = summarize(rows, target=0.9, within=6)
    assert (res["eval_0.8_iter"], res["eval_target_iter"], res["reward_target_iter"]) == (3, 5, 9)
    assert (res["best_eval_within"], res["min_eval_after"], res["final_eval"]) == (0.95, 0.6, 0.7)
