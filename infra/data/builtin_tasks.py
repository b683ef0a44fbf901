"""Built-in verifiable tasks, generated deterministically so a run needs no download.

Each answer depends on its prompt, so a policy cannot score by emitting one constant
string: for `digit-add` the most frequent sum (9) is the answer to 10 of the 55 prompts
(0.18), and no constant answer scores above 0.2 on either split (8/43 on train, 2/12
on eval). A rising reward therefore means the model reads the prompt.

- `digit-add`: `"{a}+{b}="` -> `str(a+b)` for single digits with a+b <= 9 (55 prompts).
  Eval holds out 12 prompts (about 20% of each sum, chosen with a fixed seed); train is
  the other 43, so eval measures generalisation to unseen pairs of digits.
- `digit-copy`: `"{d}:"` -> `d` (10 prompts). The easiest task: a smoke test of the loop.
  Train and eval are the same 10 prompts (there are too few to hold any out).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

import numpy as np

Split = Literal["train", "eval"]

# Fixed, not configurable: the split must never change between runs or resumes.
_DIGIT_ADD_SPLIT_SEED = 20240601
_DIGIT_ADD_EVAL_FRACTION = 0.2


def _digit_add(split: Split) -> list[dict]:
    # Stratified by sum: a plain random hold-out of 11 can put 3 prompts of one sum in eval
    # (a constant answer would then score 0.27 there). Holding out ~20% of every sum (at
    # least one; sum 0 has a single prompt and stays in train) keeps both splits' sum
    # distributions close to the whole task's.
    rng = np.random.default_rng(_DIGIT_ADD_SPLIT_SEED)
    rows = []
    for total in range(10):
        pairs = [(a, total - a) for a in range(total + 1)]
        n_eval = max(1, round(_DIGIT_ADD_EVAL_FRACTION * len(pairs))) if total else 0
        held_out = set(rng.permutation(len(pairs))[:n_eval].tolist())
        rows += [
            {"prompt": f"{a}+{b}=", "label": str(total)}
            for i, (a, b) in enumerate(pairs)
            if (i in held_out) == (split == "eval")
        ]
    return rows


def _digit_copy(split: Split) -> list[dict]:
    return [{"prompt": f"{d}:", "label": str(d)} for d in range(10)]


_TASKS: dict[str, Callable[[Split], list[dict]]] = {"digit-add": _digit_add, "digit-copy": _digit_copy}

BUILTIN_TASKS: tuple[str, ...] = tuple(_TASKS)


# A training epoch passes over a task's prompts several times: with a few dozen distinct
# prompts an epoch would otherwise end every iteration, and with it every epoch-end save
# and eval would fire every iteration.
EPOCH_ROWS = 640


def builtin_rows(name: str, split: Split) -> list[dict]:
    """Rows `{"prompt", "label"}` of built-in task `name`; the same list on every call.

    The train split repeats the task's prompts up to at least EPOCH_ROWS rows.
    """
    if name not in _TASKS:
        raise ValueError(f"unknown built-in task {name!r}; known: {', '.join(BUILTIN_TASKS)}")
    if split not in ("train", "eval"):
        raise ValueError(f"split must be 'train' or 'eval', got {split!r}")
    rows = _TASKS[name](split)
    if split == "train":
        rows = rows * -(-EPOCH_ROWS // len(rows))
    return rows
