"""Graders for real task formats: GSM8K, `\\boxed{}` math answers, short-answer EM and F1.

Each is a reward `(prompt, response, label, **kw) -> float`. The label may be the raw
dataset field (GSM8K's worked solution ending in `#### 72`, a MATH solution with a
`\\boxed{...}`): graders extract the reference themselves, so a dataset needs no
preprocessing. A label with no extractable answer is a data error and raises, which marks
the sample failed instead of silently scoring 0.
"""

from __future__ import annotations

import collections
import re
import string
from fractions import Fraction

_GSM8K_ANSWER = re.compile(r"####\s*(.+?)\s*$", re.MULTILINE)
# 1,234.5 -1/2 .5 3. : a sign, digits with thousands commas, a decimal part, or a fraction
_NUMBER = re.compile(r"[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)?(?:\.\d+)?(?:/\d+)?")


def _numbers(text: str) -> list[str]:
    return [m.group() for m in _NUMBER.finditer(text) if any(c.isdigit() for c in m.group())]


def parse_number(text: str) -> Fraction | None:
    """`"1,234"`, `"$72.00"`, `"-3/4"`, `"50%"` as exact fractions; None if not a number."""
    cleaned = text.strip().strip("$").replace(",", "").replace("\\!", "").rstrip("%.").strip()
    cleaned = cleaned.removeprefix("\\$").strip()
    frac = re.fullmatch(r"\\[dt]?frac\{([^{}]+)\}\{([^{}]+)\}", cleaned)
    if frac:
        num, den = parse_number(frac.group(1)), parse_number(frac.group(2))
        return num / den if num is not None and den else None
    try:
        return Fraction(cleaned)
    except (ValueError, ZeroDivisionError):
        return None


def gsm8k_reference(label: str) -> str:
    """The answer after `####` in a GSM8K solution; a bare label is its own answer."""
    found = _GSM8K_ANSWER.search(label)
    return found.group(1) if found else label.strip()


def gsm8k(prompt: str, response: str, label: str, **kw) -> float:
    """1 if the completion's final answer equals the reference as a number.

    The final answer is the number after the completion's own `####` if it wrote one,
    else the last number in it (models trained on GSM8K's format, and chat models that
    end with "The answer is 72.", both put it last).
    """
    target = parse_number(gsm8k_reference(label))
    if target is None:
        raise ValueError(f"label: no numeric GSM8K answer in {label[-80:]!r}")
    own = _GSM8K_ANSWER.search(response)
    candidates = _numbers(own.group(1)) if own else _numbers(response)
    if not candidates:
        return 0.0
    return float(parse_number(candidates[-1]) == target)


def last_boxed(text: str) -> str | None:
    """The content of the last `\\boxed{...}` (or `\\fbox{...}`), braces balanced."""
    start = max(text.rfind("\\boxed{"), text.rfind("\\fbox{"))
    if start < 0:
        return None
    i = text.index("{", start) + 1
    depth, begin = 1, i
    while i < len(text):
        depth += {"{": 1, "}": -1}.get(text[i], 0)
        if depth == 0:
            return text[begin:i]
        i += 1
    return None  # unbalanced: the completion was cut off inside the box


def _parse_math(answer: str) -> list:
    """The answer as SymPy objects (and its text), for math-verify's `verify`."""
    # Imported here: sympy takes half a second to import, paid only by runs that grade math.
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse

    # No parsing timeout: math-verify's is `signal.alarm`, which raises off the main thread,
    # and rewards run in worker threads; `data.reward_timeout_s` bounds the call instead.
    # In `$...$`: the LaTeX extractor reads delimited math; LaTeX first, then plain
    # expressions (`1/2`, `-1.25`), math-verify's own default order.
    return parse(
        f"${answer}$",
        extraction_config=(LatexExtractionConfig(), ExprExtractionConfig()),
        parsing_timeout=None,
    )


def boxed_math(prompt: str, response: str, label: str, **kw) -> float:
    """1 if the last `\\boxed{}` of the response equals the reference, as math-verify judges.

    The reference is the label's own last `\\boxed{}` (a raw MATH solution) or the whole
    label. Both sides are parsed to SymPy and compared numerically and symbolically:
    `-\\frac{5}{4}` = `-1.25`, `\\sqrt{12}` = `2\\sqrt{3}`, `y = 7` = `7`, `\\{1,2\\}` =
    `\\{2,1\\}`, `50\\%` = `50`, `5 \\text{ cm}` = `5`; a response with no box scores 0.
    """
    from math_verify import verify

    reference = last_boxed(label)
    reference = label if reference is None else reference
    if not reference.strip():
        raise ValueError("label: empty math answer")
    gold = _parse_math(reference)
    if not gold:
        raise ValueError(f"label: no math answer in {reference[-80:]!r}")
    got = last_boxed(response)
    if got is None:
        return 0.0
    # verify is not symmetric (the gold side decides how an assignment or a relation is read).
    return float(verify(gold, _parse_math(got), timeout_seconds=None))


def normalize_answer(text: str) -> str:
    """SQuAD-style normalisation: lower case, no punctuation, no articles, single spaces."""
    text = "".join(c for c in text.lower() if c not in set(string.punctuation))
    text = re.sub(r"\b(a|an|the)\b", " ", text)
    return " ".join(text.split())


def normalized_exact_match(prompt: str, response: str, label: str, **kw) -> float:
    return float(normalize_answer(response) == normalize_answer(label))


def token_f1(prompt: str, response: str, label: str, **kw) -> float:
    """Harmonic mean of token precision and recall after normalisation (SQuAD's F1)."""
    got, want = normalize_answer(response).split(), normalize_answer(label).split()
    if not got or not want:
        return float(got == want)
    common = sum((collections.Counter(got) & collections.Counter(want)).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(got), common / len(want)
    return 2 * precision * recall / (precision + recall)
