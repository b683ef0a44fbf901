"""Graders on strings in the real formats of GSM8K, MATH and short-answer QA datasets."""

from __future__ import annotations

import pytest

from infra.data.graders import boxed_math, gsm8k, last_boxed, normalized_exact_match, parse_number, token_f1
from infra.data.rewards import resolve_reward

# A GSM8K training row's answer field, verbatim in format (worked solution, then "#### N").
GSM8K_LABEL = (
    "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\n"
    "Natalia sold 48+24 = <<48+24=72>>72 clips altogether in April and May.\n#### 72"
)


def test_gsm8k_reads_the_reference_after_hashes_and_the_last_number_of_the_completion() -> None:
    # the first number of the completion (48) is not the answer; the last one is
    assert gsm8k("", "She sold 48 in April and 24 in May, so 48 + 24 = 72.", GSM8K_LABEL) == 1.0
    assert gsm8k("", "She sold 48 clips in April. The answer is 70.", GSM8K_LABEL) == 0.0
    assert gsm8k("", "48 + 24 = 72\n#### 72", GSM8K_LABEL) == 1.0
    # the completion's own "####" wins over numbers written after it
    assert gsm8k("", "#### 72\nThat was 3 steps.", GSM8K_LABEL) == 1.0
    assert gsm8k("", "no idea", GSM8K_LABEL) == 0.0


def test_gsm8k_number_formats() -> None:
    assert gsm8k("", "The total is $1,234.", "#### 1234") == 1.0
    assert gsm8k("", "It costs 18.00 dollars", "#### 18") == 1.0
    assert gsm8k("", "so -5 degrees", "#### -5") == 1.0
    assert gsm8k("", "answer: 72", "72") == 1.0  # a bare label is its own reference
    with pytest.raises(ValueError, match="label"):
        gsm8k("", "72", "the answer is unknown")


def test_parse_number_is_exact() -> None:
    assert parse_number("1,000") == 1000
    assert parse_number("\\frac{3}{4}") == parse_number("0.75") == parse_number("3/4")
    assert parse_number("50%") == 50
    assert parse_number("x+1") is None


def test_last_boxed_balances_braces() -> None:
    assert last_boxed("so \\boxed{1} then \\boxed{\\frac{1}{2}}.") == "\\frac{1}{2}"
    assert last_boxed("\\boxed{\\frac{1}{2") is None  # cut off inside the box
    assert last_boxed("no box") is None


def test_boxed_math_equivalences() -> None:
    label = "The sum is $\\frac{1}{2}+0 = \\boxed{\\frac{1}{2}}$."  # a raw MATH solution
    for response in ("\\boxed{0.5}", "\\boxed{1/2}", "\\boxed{\\dfrac{1}{2}}", "so \\boxed{ \\frac{1}{2} }."):
        assert boxed_math("", response, label) == 1.0, response
    assert boxed_math("", "\\boxed{0.25}", label) == 0.0
    assert boxed_math("", "0.5 without a box", label) == 0.0
    # non-numeric answers compare after normalisation
    assert (
        boxed_math("", "\\boxed{\\left( 3, \\frac{\\pi}{2} \\right)}", "\\boxed{(3,\\frac{\\pi}{2})}") == 1.0
    )
    assert boxed_math("", "\\boxed{10^\\circ}", "10") == 1.0
    assert boxed_math("", "\\boxed{5 \\text{ cm}}", "5cm") == 1.0


def test_short_answer_em_and_f1() -> None:
    assert normalized_exact_match("", "The Eiffel Tower!", "eiffel tower") == 1.0
    assert normalized_exact_match("", "Eiffel", "eiffel tower") == 0.0
    # precision 1/1, recall 1/2 -> F1 = 2/3
    assert token_f1("", "Eiffel", "the Eiffel Tower") == pytest.approx(2 / 3)
    # precision 2/4, recall 2/2 -> F1 = 2 * 0.5 * 1 / 1.5 = 2/3
    assert token_f1("", "it is eiffel tower", "Eiffel Tower") == pytest.approx(2 / 3)
    assert token_f1("", "Louvre", "Eiffel Tower") == 0.0
    assert token_f1("", "", "") == 1.0


def test_graders_are_registered() -> None:
    for name in ("gsm8k", "boxed_math", "normalized_exact_match", "f1"):
        assert callable(resolve_reward(name))
