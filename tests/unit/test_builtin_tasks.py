from collections import Counter

import pytest

from infra.data.builtin_tasks import BUILTIN_TASKS, builtin_rows


def _best_constant_score(rows: list[dict]) -> float:
    return Counter(r["label"] for r in rows).most_common(1)[0][1] / len(rows)


@pytest.mark.parametrize("name", BUILTIN_TASKS)
@pytest.mark.parametrize("split", ["train", "eval"])
def test_no_constant_answer_scores_above_0_2(name: str, split: str) -> None:
    assert _best_constant_score(builtin_rows(name, split)) <= 0.2


def test_digit_add_split_is_disjoint_fixed_and_complete() -> None:
    train, eval_ = builtin_rows("digit-add", "train"), builtin_rows("digit-add", "eval")
    train_prompts, eval_prompts = {r["prompt"] for r in train}, {r["prompt"] for r in eval_}
    assert (len(train_prompts), len(eval_), len(train)) == (43, 12, 43 * 15)
    assert not train_prompts & eval_prompts
    assert len(train_prompts | eval_prompts) == 55
    assert builtin_rows("digit-add", "eval") == eval_  # deterministic
    for row in train + eval_:
        a, b = row["prompt"].rstrip("=").split("+")
        assert row["label"] == str(int(a) + int(b)) and int(row["label"]) <= 9


def test_digit_copy() -> None:
    rows = builtin_rows("digit-copy", "eval")
    assert [(r["prompt"], r["label"]) for r in rows] == [(f"{d}:", str(d)) for d in range(10)]
    # an epoch of training passes over the prompts many times, each equally often
    assert builtin_rows("digit-copy", "train") == rows * 64


def test_unknown_task_lists_known_ones() -> None:
    with pytest.raises(ValueError, match="digit-add.*digit-copy"):
        builtin_rows("nope", "train")
