"""Rule-based rewards: plain functions `(prompt, response, label, **kw) -> float`.

A run names its reward by registry name, `module:function` (a plugin, as in slime) or
`path/to/file.py:function`, so a new task needs no change here. `async def` rewards
(e.g. calling a judge service) are run concurrently. Every call has a time limit: a reward
that hangs marks its sample failed instead of hanging the run.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import importlib
import importlib.util
import inspect
import math
import numbers
import os
import re
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Literal

from infra.config import DataConfig
from infra.data import graders
from infra.data.group_rewards import batch_reward, group_reward, scope_of, score_lists

__all__ = ["REWARDS", "batch_reward", "group_reward", "resolve_reward", "score"]

RewardFn = Callable[..., float]

# Largest reward magnitude taken as a reward. Beyond it a value is a bug (an overflow, a
# sentinel), not a score, and it would overflow the advantages: the group mean of two
# rewards of 1e308 is already inf. Such a sample fails like one whose reward raised.
MAX_ABS_REWARD = 1e6

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


def char_match(prompt: str, response: str, label: str, stop: Iterable[str] = (), **kw) -> float:
    """Partial credit: the share of positions where response and label have the same character,
    over the longer of the two (1 only for an exact match). From a random start a multi-token
    answer is almost never exactly right, so exact match gives GRPO no signal; per-character
    credit lets a policy learn an answer one position at a time."""
    text, target = clean_response(response, stop), label.strip()
    longest = max(len(text), len(target))
    if not longest:
        return 1.0
    return sum(a == b for a, b in zip(text, target, strict=False)) / longest


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
    "char_match": char_match,
    "contains": contains,
    "numeric_match": numeric_match,
    "gsm8k": graders.gsm8k,
    "boxed_math": graders.boxed_math,
    "normalized_exact_match": graders.normalized_exact_match,
    "f1": graders.token_f1,
}


# Registered rewards whose time is linear in the response (which max_new_tokens bounds) and
# that touch nothing outside it: they cannot hang, so `score` calls them in line. A thread
# per item, for the timeout, cost more than the call: it was most of the rollout manager's
# CPU at the demo shape (py-spy), 1024 one-token samples an iteration.
LINEAR_TIME_REWARDS = (exact_match, prefix_match, char_match, contains, numeric_match)


def resolve_reward(spec: str, data: DataConfig | None = None) -> RewardFn:
    """A registered reward by name, the function at `module:function` or `file.py:function`,
    or a reward service at `http(s)://...` (batched and retried per `data.remote_reward`)."""
    if spec in REWARDS:
        return REWARDS[spec]
    if spec.startswith(("http://", "https://")):
        from infra.data.remote_reward import RemoteReward

        data = data or DataConfig()
        return RemoteReward(spec, data.remote_reward, data.reward_timeout_s)
    known = f"registered rewards: {', '.join(REWARDS)}; or give `module:function` or `file.py:function`"
    fn = load_callable(spec, "reward", f"; {known}")
    if data is None or data.reward_isolation == "thread" or inspect.iscoroutinefunction(fn):
        return fn
    from infra.data.reward_process import ProcessReward  # noqa: PLC0415 - pebble, only for plug-ins

    return ProcessReward(spec, fn, data.reward_timeout_s, data.reward_workers)


def load_callable(spec: str, what: str, hint: str = "") -> Callable:
    """The callable at `module:function` or `file.py:function` (a plug-in); errors name `what`."""
    module_name, sep, attr = spec.rpartition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"unknown {what} {spec!r}{hint}")
    try:
        obj = load_module(module_name)
        for part in attr.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError, OSError, SyntaxError) as e:
        raise ValueError(f"cannot load {what} {spec!r}: {type(e).__name__}: {e}{hint}") from e
    if not callable(obj):
        raise ValueError(f"{what} {spec!r} is not callable{hint}")
    return obj


def load_module(name: str):
    if not name.endswith(".py"):
        return importlib.import_module(name)
    # A plug-in file: loaded by path in every process (the driver and the Ray workers), so
    # it needs no PYTHONPATH; on a multi-node cluster the path must exist on every node.
    path = os.path.abspath(name)
    if not os.path.isfile(path):
        raise ImportError(f"no such file: {path}")
    module_name = "prl_plugin_" + os.path.splitext(os.path.basename(path))[0]
    if module_name in sys.modules and getattr(sys.modules[module_name], "__file__", None) == path:
        return sys.modules[module_name]
    module_spec = importlib.util.spec_from_file_location(module_name, path)
    if module_spec is None or module_spec.loader is None:
        raise ImportError(f"cannot load {path} as a Python module")
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[module_name] = module
    try:
        module_spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(module_name, None)
        raise
    return module


@dataclass
class RewardResult:
    reward: float
    status: Literal["completed", "failed"] = "completed"
    error: str = ""


def reward_name(fn: RewardFn) -> str:
    """How errors name a reward: its service URL, or `module:function`."""
    if isinstance(getattr(fn, "url", None), str):
        return fn.url
    name = getattr(fn, "__qualname__", None) or type(fn).__qualname__
    return f"{getattr(fn, '__module__', None) or '?'}:{name}"


def _result(value: object, name: str) -> RewardResult:
    if isinstance(value, BaseException):
        return RewardResult(0.0, "failed", f"{type(value).__name__}: {value}")
    if not isinstance(value, numbers.Real):  # a bool counts as 0 or 1
        return RewardResult(0.0, "failed", f"reward {name} must return a finite number, got {value!r}")
    try:
        number = float(value)
    except OverflowError:  # an int beyond any float
        number = math.inf
    if not math.isfinite(number) or abs(number) > MAX_ABS_REWARD:
        return RewardResult(
            0.0,
            "failed",
            f"reward {name} returned {value!r}: rewards must be finite numbers within +-{MAX_ABS_REWARD:g}",
        )
    return RewardResult(number)


class RewardTimeout(TimeoutError):
    pass


def score(
    fn: RewardFn,
    items: list[tuple[str, str, str]],
    timeout_s: float | None = None,
    groups: list[int] | None = None,
    **kw,
) -> list[RewardResult]:
    """Reward every (prompt, response, label); a failing item gets status "failed", reward 0
    and the error text, and the others are unaffected. With `timeout_s`, a call that runs
    longer fails its item (its thread is abandoned: Python cannot stop a thread; a
    `ProcessReward` stops its worker process instead). A group
    reward is called once per `groups` id, a batch reward once for all items."""
    if scope_of(fn) != "sample":
        values = score_lists(fn, items, groups or [0] * len(items), timeout_s, **kw)
        return [_result(v, reward_name(fn)) for v in values]
    if getattr(fn, "enforces_timeout", False):
        values = fn.call_many(items, kw)
    elif timeout_s is None or any(fn is r for r in LINEAR_TIME_REWARDS):  # `is`: fn may be unhashable
        values = [_call(fn, item, kw) for item in items]
    else:
        values = _call_all_with_timeout(fn, items, kw, timeout_s)
    pending = {i: v for i, v in enumerate(values) if inspect.isawaitable(v)}
    if pending:
        for i, value in zip(pending, _run_all(list(pending.values()), timeout_s), strict=True):
            values[i] = value
    name = reward_name(fn)
    return [_result(v, name) for v in values]


def _call(fn: RewardFn, item: tuple[str, str, str], kw: dict) -> object:
    try:
        return fn(*item, **kw)
    except Exception as e:
        return e


# Threads of one scoring pass; a hung reward holds one, so a few spare ones keep others going.
_REWARD_THREADS = 16


def _call_all_with_timeout(fn: RewardFn, items: list, kw: dict, timeout_s: float) -> list[object]:
    started: dict[int, float] = {}

    def run(i: int) -> object:
        started[i] = time.monotonic()
        return _call(fn, items[i], kw)

    pool = concurrent.futures.ThreadPoolExecutor(min(_REWARD_THREADS, max(1, len(items))), "reward")
    futures = {pool.submit(run, i): i for i in range(len(items))}
    values: list[object] = [None] * len(items)
    # Items that never start (every thread held by a hung call) fail by this deadline.
    waves = -(-len(items) // _REWARD_THREADS)
    give_up = time.monotonic() + timeout_s * (waves + 1)
    pending = set(futures)
    try:
        while pending:
            done, pending = concurrent.futures.wait(pending, timeout=min(0.05, timeout_s))
            for f in done:
                values[futures[f]] = f.result()
            now = time.monotonic()
            for f in list(pending):
                i = futures[f]
                start = started.get(i)
                if (start is not None and now - start > timeout_s) or (start is None and now > give_up):
                    values[i] = RewardTimeout(f"reward call exceeded data.reward_timeout_s={timeout_s:g}")
                    pending.discard(f)
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
    return values


def _run_all(awaitables: list, timeout_s: float | None = None) -> list:
    async def bounded(aw):
        try:
            return await asyncio.wait_for(aw, timeout_s)
        except TimeoutError:
            return RewardTimeout(f"reward call exceeded data.reward_timeout_s={timeout_s:g}")

    async def gather() -> list:
        return await asyncio.gather(*(bounded(a) for a in awaitables), return_exceptions=True)

    try:
        asyncio.get_running_loop()
    except RuntimeError:  # no loop in this thread (the usual case): run our own
        return asyncio.run(gather())
    # Called from inside a running loop (an async Ray actor): asyncio.run would refuse, and
    # blocking that loop on itself would deadlock, so run a fresh loop in another thread.
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, gather()).result()
