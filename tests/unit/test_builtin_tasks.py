from collections import Counter

import pytest

from infra.data.builtin_tasks import BUILTIN_TASKS, builtin_rows
from infra.data.rewards import char_match


def _distinct(rows: list[dict]) -> list[dict]:
    return list({r["prompt"]: r for r in rows}.values())


def _best_constant_score(rows: list[dict]) -> float:
    return Counter(r["label"] for r in rows).most_common(1)[0][1] / len(rows)


@pytest.mark.parametrize("name", BUILTIN_TASKS)
@pytest.mark.parametrize("split", ["train", "eval"])
def test_no_constant_answer_scores_above_0_2(name: str, split: str) -> None:
    assert _best_constant_score(builtin_rows(name, split)) <= 0.2


@pytest.mark.parametrize("name", BUILTIN_TASKS)
def test_train_and_eval_are_disjoint_and_deterministic(name: str) -> None:
    train, eval_ = builtin_rows(name, "train"), builtin_rows(name, "eval")
    assert eval_ and not {r["prompt"] for r in train} & {r["prompt"] for r in eval_}
    assert len(_distinct(eval_)) == len(eval_)  # eval holds each prompt once
    assert builtin_rows(name, "train") == train and builtin_rows(name, "eval") == eval_


@pytest.mark.parametrize("name", BUILTIN_TASKS)
def test_the_labelled_sft_split_is_the_train_prompts_once_and_no_eval_prompt(name: str) -> None:
    labelled, train, eval_ = (builtin_rows(name, s) for s in ("sft", "train", "eval"))
    assert labelled == _distinct(train)  # each train prompt once, with the answer RL rewards
    assert not {r["prompt"] for r in labelled} & {r["prompt"] for r in eval_}
    assert builtin_rows(name, "sft") == labelled


def test_digit_add_split_is_disjoint_fixed_and_complete() -> None:
    train, eval_ = builtin_rows("digit-add", "train"), builtin_rows("digit-add", "eval")
    train_prompts, eval_prompts = {r["prompt"] for r in train}, {r["prompt"] for r in eval_}
    assert (len(train_prompts), len(eval_), len(train)) == (43, 12, 43 * 15)
    assert len(train_prompts | eval_prompts) == 55
    for row in train + eval_:
        a, b = row["prompt"].rstrip("=").split("+")
        assert row["label"] == str(int(a) + int(b)) and int(row["label"]) <= 9


def test_digit_copy_holds_out_one_end_mark_per_answer() -> None:
    train, eval_ = builtin_rows("digit-copy", "train"), builtin_rows("digit-copy", "eval")
    distinct = _distinct(train)
    assert (len(distinct), len(eval_)) == (40, 10)
    for row in distinct + eval_:
        assert len(row["prompt"]) == 2 and row["prompt"][0] == row["label"] and row["prompt"][1] in ":=>#~"
    # every answer has 4 train prompts and 1 eval prompt, so a constant answer scores exactly 0.1
    assert set(Counter(r["label"] for r in distinct).values()) == {4}
    assert sorted(r["label"] for r in eval_) == [str(d) for d in range(10)]
    # an epoch of training passes over the prompts several times, each equally often
    assert set(Counter(r["prompt"] for r in train).values()) == {16}


def test_addition_answers_are_two_digit_sums_and_the_split_is_stratified() -> None:
    train, eval_ = builtin_rows("addition", "train"), builtin_rows("addition", "eval")
    distinct = _distinct(train)
    assert (len(distinct), len(eval_), len(train)) == (80, 20, 80 * 8)
    assert len({r["prompt"] for r in distinct} | {r["prompt"] for r in eval_}) == 10 * 10
    for row in distinct + eval_:
        a, b = map(int, row["prompt"].rstrip("=").split("+"))
        assert 10 <= a <= 19 and 10 <= b <= 19 and row["label"] == str(a + b)
        assert len(row["label"]) == 2  # two tokens with the character tokenizer
    # both answer digits vary: the tens digit is the carry, the units digit the sum mod 10
    assert {r["label"][0] for r in eval_} == {"2", "3"} and len({r["label"][1] for r in eval_}) >= 8
    # the bounds the module docstring states: exact match and char_match of the best constant
    assert _best_constant_score(distinct) == 8 / 80 and _best_constant_score(eval_) == 2 / 20
    for rows in (distinct, eval_):
        best = max(
            sum(char_match("", c, r["label"]) for r in rows) / len(rows) for c in {r["label"] for r in rows}
        )
        assert best == pytest.approx(0.325)
    # shuffled: the first eval.num_prompts rows are not just the smallest sums
    assert len({r["label"] for r in eval_[:8]}) > 5


def test_pair_copy_copies_two_digits_and_holds_out_two_pairs_per_first_digit() -> None:
    train, eval_ = builtin_rows("pair-copy", "train"), builtin_rows("pair-copy", "eval")
    distinct = _distinct(train)
    assert (len(distinct), len(eval_)) == (80, 20)
    for row in distinct + eval_:
        assert row["prompt"] == row["label"] + ":" and len(row["label"]) == 2
    assert Counter(r["label"][0] for r in eval_) == {str(a): 2 for a in range(10)}
    # the bounds the module docstring states, over every two-digit constant answer
    for rows, exact, chars in ((distinct, 1 / 80, 0.10625), (eval_, 1 / 20, 0.15)):
        assert _best_constant_score(rows) == exact
        best = max(sum(char_match("", f"{c:02d}", r["label"]) for r in rows) / len(rows) for c in range(100))
        assert best == pytest.approx(chars)


def test_unknown_task_lists_known_ones() -> None:
    with pytest.raises(ValueError, match="digit-add.*digit-copy.*addition"):
        builtin_rows("nope", "train")
