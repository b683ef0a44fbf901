"""Rule-based rewards: plain functions `(prompt, response, label, **kw) -> float`.

A run names its reward by registry name or `module:function` (a plugin, as in slime), so
a new task needs no change here. `async def` rewards (e.g. calling a judge service) are
run concurrently.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import importlib
import inspect
import math
import numbers
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Literal

from infra.data import graders

RewardFn = Callable[..., float]

# End-of-sequence texts a detokenized response may end with; they are not part of the answer.
EOS_TEXTS = ("</s>", "<|endoftext|>", "<|im_end|>", "<|eot_id|>", "<eos>")
_NUMBER = re.compile(r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?")


def clean_response(response: str, stop: Iterable[str] = ()) -> str:
    """The response without surrounding whitespace and trailing stop / EOS texts."""
    text = response.strip()
    endings = [s for s in (*stop, *EOS_TEXTS) if s]
    changed = True
    while changed:
        changed = False
        for end in endings:
            if text.endswith(end):
                text = text[: -len(end)].strip()
                changed = True
    return text


def exact_match(prompt: str, response: str, label: str, stop: Iterable[str] = (), **kw) -> float:
    return float(clean_response(response, stop) == label.strip())


def prefix_match(prompt: str, response: str, label: str, stop: Iterable[str] = (), **kw) -> float:
    return float(clean_response(response, stop).startswith(label.strip()))


def contains(prompt: str, response: str, label: str, **kw) -> float:
    return float(label.strip() in response)


def numeric_match(prompt: str, response: str, label: str, **kw) -> float:
    """1 if the first number in the response equals the label as a number ("9.0" == "9")."""
    target = float(label)  # a non-numeric label is a data error: the sample is marked failed
    found = _NUMBER.search(response)
    return float(
        found is not None and math.isclose(float(found.group()), target, rel_tol=1e-9, abs_tol=1e-12)
    )


REWARDS: dict[str, RewardFn] = {
    "exact_match": exact_match,
    "prefix_match": prefix_match,
    "contains": contains,
    "numeric_match": numeric_match,
    "gsm8k": graders.gsm8k,
    "boxed_math": graders.boxed_math,
    "normalized_exact_match": graders.normalized_exact_match,
    "f1": graders.token_f1,
}


def resolve_reward(spec: str) -> RewardFn:
    """A registered reward by name, or the function at `module:function`."""
    if spec in REWARDS:
        return REWARDS[spec]
    known = f"registered rewards: {', '.join(REWARDS)}; or give `module:function`"
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"unknown reward {spec!r}; {known}")
    try:
        obj = importlib.import_module(module_name)
        for part in attr.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError) as e:
        raise ValueError(f"cannot load reward {spec!r}: {e}; {known}") from e
    if not callable(obj):
        raise ValueError(f"reward {spec!r} is not callable; {known}")
    return obj


@dataclass
class RewardResult:
    reward: float
    status: Literal["completed", "failed"] = "completed"
    error: str = ""


def _result(value: object) -> RewardResult:
    if isinstance(value, BaseException):
        return RewardResult(0.0, "failed", f"{type(value).__name__}: {value}")
    if not isinstance(value, numbers.Real) or not math.isfinite(float(value)):
        return RewardResult(0.0, "failed", f"reward must be a finite number, got {value!r}")
    return RewardResult(float(value))


def score(fn: RewardFn, items: list[tuple[str, str, str]], **kw) -> list[RewardResult]:
    """Reward every (prompt, response, label); a failing item gets status "failed", reward 0
    and the error text, and the others are unaffected."""
    values: list[object] = []
    pending: dict[int, object] = {}  # item index -> awaitable
    for i, (prompt, response, label) in enumerate(items):
        try:
            value = fn(prompt, response, label, **kw)
        except Exception as e:
            value = e
        if inspect.isawaitable(value):
            pending[i] = value
        values.append(value)
    if pending:
        for i, value in zip(pending, _run_all(list(pending.values())), strict=True):
            values[i] = value
    return [_result(v) for v in values]


def _run_all(awaitables: list) -> list:
    async def gather() -> list:
        return await asyncio.gather(*awaitables, return_exceptions=True)

    try:
        asyncio.get_running_loop()
    except RuntimeError:  # no loop in this thread (the usual case): run our own
        return asyncio.run(gather())
    # Called from inside a running loop (an async Ray actor): asyncio.run would refuse, and
    # blocking that loop on itself would deadlock, so run a fresh loop in another thread.
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, gather()).result()
