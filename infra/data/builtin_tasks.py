"""Built-in verifiable tasks, generated deterministically so a run needs no download.

Each answer depends on its prompt, so a policy cannot score by emitting one constant
string; every task holds out an eval split of prompts it never trains on, stratified by
answer so that no answer is over-represented in either split. A rising reward therefore
means the model reads the prompt, and eval accuracy means it generalises.

- `digit-copy`: `"{d}{m}"` -> `d`, copy the digit before the end mark `m`, one of
  `: = > # ~` (50 prompts). The easiest task: a smoke test of the loop. Eval holds out
  one end mark for every digit (10 prompts); train is the other 40. Every answer is 10%
  of each split, so no constant answer scores above 0.1.
- `digit-add`: `"{a}+{b}="` -> `str(a+b)` for single digits with a+b <= 9 (55 prompts).
  Eval holds out 12 prompts (about 20% of each sum); train is the other 43. The most
  frequent sum (9) is the answer to 10 of the 55 prompts (0.18), and no constant answer
  scores above 0.2 on either split (8/43 on train, 2/12 on eval).
- `addition`: `"{a}+{b}="` -> `str(a+b)` for a, b in 10..19 (100 prompts), answers of
  two digits, one token each with the built-in character tokenizer: the tens digit is the
  carry (2 or 3), the units digit (a+b) mod 10. Eval holds out 20% of each sum (20
  prompts, shuffled so any leading subset is representative); train is the other 80. The
  best constant answer (29) scores 8/80 = 0.1 on train and 2/20 = 0.1 on eval; under the
  partial-credit `char_match` reward the best constant (29) scores 0.325 on either split.
  (a, b in 10..49, 1600 prompts, is too much for the tiny model to learn in a demo run.)
- `pair-copy`: `"{a}{b}:"` -> `"{a}{b}"` for digits a, b (100 prompts): answers of two
  tokens, each the token two positions back. Eval holds out two pairs for every first digit
  (20 prompts, shuffled); train is the other 80. Every answer is one prompt's, so a constant
  answer matches at most 1/80 of train and 1/20 of eval exactly; under `char_match` the best
  constant scores 0.106 on train and 0.15 on eval (`tests/unit/test_builtin_tasks.py`).

Every task also has a labelled `sft` split for the supervised warm start (docs/SFT.md): its
train prompts, each once, with their answers. It holds none of the eval prompts, so a model
fine-tuned on it is still evaluated on prompts it never saw.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

import numpy as np

Split = Literal["train", "eval", "sft"]

# Fixed, not configurable: the splits must never change between runs or resumes.
_DIGIT_ADD_SPLIT_SEED = 20240601
_DIGIT_ADD_EVAL_FRACTION = 0.2
_DIGIT_COPY_SPLIT_SEED = 20240602
_DIGIT_COPY_MARKS = ":=>#~"
_ADDITION_SPLIT_SEED = 20240603
_ADDITION_RANGE = range(10, 20)
_PAIR_COPY_SPLIT_SEED = 20240604


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
    # The end mark varies, so held-out prompts pair every answer with an end mark it was never
    # trained with; each answer keeps 4 train and 1 eval prompt. The prompt holds one digit
    # and one mark only, so the task stays as easy as copying that digit.
    rng = np.random.default_rng(_DIGIT_COPY_SPLIT_SEED)
    rows = []
    for d in range(10):
        held_out = int(rng.integers(len(_DIGIT_COPY_MARKS)))
        rows += [
            {"prompt": f"{d}{mark}", "label": str(d)}
            for i, mark in enumerate(_DIGIT_COPY_MARKS)
            if (i == held_out) == (split == "eval")
        ]
    return _shuffled(rows, rng) if split == "eval" else rows


def _addition(split: Split) -> list[dict]:
    # Stratified by sum as digit-add is: ~20% of every sum's pairs held out (a sum with one or
    # two pairs, 20, 21, 37 or 38, stays in train), so both splits keep the task's sum distribution.
    rng = np.random.default_rng(_ADDITION_SPLIT_SEED)
    lo, hi = _ADDITION_RANGE[0], _ADDITION_RANGE[-1]
    rows = []
    for total in range(2 * lo, 2 * hi + 1):
        pairs = [(a, total - a) for a in _ADDITION_RANGE if lo <= total - a <= hi]
        n_eval = round(_DIGIT_ADD_EVAL_FRACTION * len(pairs))
        held_out = set(rng.permutation(len(pairs))[:n_eval].tolist())
        rows += [
            {"prompt": f"{a}+{b}=", "label": str(total)}
            for i, (a, b) in enumerate(pairs)
            if (i in held_out) == (split == "eval")
        ]
    # Evaluation reads the first eval.num_prompts rows: in sum order those would all be small sums.
    return _shuffled(rows, rng) if split == "eval" else rows


def _pair_copy(split: Split) -> list[dict]:
    # Stratified by first digit: 2 of its 10 pairs held out, so every first digit appears
    # in both splits and eval asks for pairs of digits the model never copied together.
    rng = np.random.default_rng(_PAIR_COPY_SPLIT_SEED)
    rows = []
    for a in range(10):
        held_out = set(rng.permutation(10)[:2].tolist())
        rows += [
            {"prompt": f"{a}{b}:", "label": f"{a}{b}"}
            for b in range(10)
            if (b in held_out) == (split == "eval")
        ]
    return _shuffled(rows, rng) if split == "eval" else rows


def _shuffled(rows: list[dict], rng: np.random.Generator) -> list[dict]:
    return [rows[i] for i in rng.permutation(len(rows))]


_TASKS: dict[str, Callable[[Split], list[dict]]] = {
    "digit-add": _digit_add,
    "digit-copy": _digit_copy,
    "addition": _addition,
    "pair-copy": _pair_copy,
}

BUILTIN_TASKS: tuple[str, ...] = tuple(_TASKS)


# A training epoch passes over a task's prompts several times: with a few dozen distinct
# prompts an epoch would otherwise end every iteration, and with it every epoch-end save
# and eval would fire every iteration.
EPOCH_ROWS = 640


def builtin_rows(name: str, split: Split) -> list[dict]:
    """Rows `{"prompt", "label"}` of built-in task `name`; the same list on every call.

    The train split repeats the task's prompts up to at least EPOCH_ROWS rows; the sft split
    is the train prompts once each, the label the answer to train on.
    """
    if name not in _TASKS:
        raise ValueError(f"unknown built-in task {name!r}; known: {', '.join(BUILTIN_TASKS)}")
    if split not in ("train", "eval", "sft"):
        raise ValueError(f"split must be 'train', 'eval' or 'sft', got {split!r}")
    rows = _TASKS[name]("eval" if split == "eval" else "train")
    if split == "train":
        rows = rows * -(-EPOCH_ROWS // len(rows))
    return rows
