"""`boxed_math` grades by math-verify: equal forms of one answer score 1, different answers 0."""

from __future__ import annotations

import threading

import pytest

from infra.data.graders import boxed_math
from infra.data.rewards import score

# (the model's boxed answer, the reference): the same value written two ways
EQUAL = [
    # fractions and decimals, with signs
    ("-\\frac{5}{4}", "-1.25"),
    ("\\dfrac{3}{8}", "0.375"),
    ("7/2", "3\\frac{1}{2}"),
    ("-0.2", "\\frac{-1}{5}"),
    # radicals
    ("\\sqrt{12}", "2\\sqrt{3}"),
    ("\\frac{\\sqrt{2}}{2}", "\\frac{1}{\\sqrt{2}}"),
    ("\\sqrt[3]{27}", "3"),
    # an assignment against a bare value, either way round
    ("y = 7", "7"),
    ("x = 3", "3"),
    ("-4", "a=-4"),
    # sets, in any order, and tuples
    ("\\{3, 1, 2\\}", "\\{1,2,3\\}"),
    ("\\left( 3, \\frac{\\pi}{2} \\right)", "(3,\\frac{\\pi}{2})"),
    # intervals, and an inequality against its interval
    ("[-2, 5)", "[-2,5)"),
    ("(-\\infty, 0]", "(-\\infty,0]"),
    ("[2, 5]", "2 \\le x \\le 5"),
    # polynomials, expanded or factored
    ("x^2 + 2x + 1", "(x+1)^2"),
    ("6a - 9", "3(2a-3)"),
    # percent and units
    ("40\\%", "40"),
    ("25\\%", "\\frac{1}{4}"),
    ("12 \\text{ cm}", "12"),
    ("90^\\circ", "90"),
    ("\\$18.00", "18"),
    ("1,200", "1200"),
]

# (the model's boxed answer, the reference): different answers
DIFFERENT = [
    ("\\frac{5}{4}", "-1.25"),  # the sign
    ("2\\sqrt{2}", "\\sqrt{12}"),
    ("y = 8", "7"),
    ("\\{1, 2\\}", "\\{1,2,3\\}"),
    ("(-2, 5)", "[-2,5)"),  # an open end where the reference is closed
    ("[-2, 5]", "[-2,5)"),
    ("x^2 + 2x", "(x+1)^2"),
    ("3(2a+3)", "6a - 9"),
    ("0.333", "\\frac{1}{3}"),  # agrees to 3 places only
    ("41\\%", "40"),
    ("1.200", "1200"),
    ("\\text{Tuesday}", "\\text{Monday}"),
]


@pytest.mark.parametrize(("answer", "reference"), EQUAL)
def test_equal_forms_score_one(answer: str, reference: str) -> None:
    assert boxed_math("", f"So the answer is $\\boxed{{{answer}}}$.", reference) == 1.0


@pytest.mark.parametrize(("answer", "reference"), DIFFERENT)
def test_different_answers_score_zero(answer: str, reference: str) -> None:
    assert boxed_math("", f"So the answer is $\\boxed{{{answer}}}$.", reference) == 0.0


def test_reference_is_the_labels_last_box() -> None:
    # a raw MATH solution: an intermediate value, then the boxed answer
    label = "We get $x = \\frac{10}{8}$, so $x = \\boxed{\\frac{5}{4}}$."
    assert boxed_math("", "\\boxed{1.25}", label) == 1.0
    assert boxed_math("", "\\boxed{10}", label) == 0.0
    # only the response's last box counts, and an unboxed answer scores 0
    assert boxed_math("", "first \\boxed{3}, then \\boxed{1.25}", label) == 1.0
    assert boxed_math("", "first \\boxed{1.25}, then \\boxed{3}", label) == 0.0
    assert boxed_math("", "the answer is 1.25", label) == 0.0
    assert boxed_math("", "\\boxed{\\frac{5}{4", label) == 0.0  # cut off inside the box


def test_a_label_with_no_answer_is_a_data_error() -> None:
    with pytest.raises(ValueError, match="label"):
        boxed_math("", "\\boxed{1}", "   ")
    with pytest.raises(ValueError, match="label"):
        boxed_math("", "\\boxed{1}", "\\boxed{}")


def test_grades_off_the_main_thread() -> None:
    # math-verify's default timeout is signal.alarm, which raises outside the main thread;
    # here every call runs in a worker thread and must still grade.
    results: list[object] = []

    def grade() -> None:
        try:
            results.append(
                [boxed_math("", f"\\boxed{{{a}}}", r) for a, r in (("-\\frac{5}{4}", "-1.25"), ("3", "4"))]
            )
        except Exception as e:  # the failure, to show in the assertion below
            results.append(e)

    thread = threading.Thread(target=grade)
    thread.start()
    thread.join(60)
    assert results == [[1.0, 0.0]]


def test_scored_under_the_reward_timeout_in_reward_threads() -> None:
    # the path a rollout takes: a timeout given, so each call runs in the reward thread pool
    items = [("", f"\\boxed{{{a}}}", r) for a, r in EQUAL[:4] + DIFFERENT[:4]]
    results = score(boxed_math, items, timeout_s=30.0)
    assert [r.status for r in results] == ["completed"] * 8, [r.error for r in results]
    assert [r.reward for r in results] == [1.0] * 4 + [0.0] * 4
