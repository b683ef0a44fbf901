"""Three small single-token tasks that no config in this repository was tuned on, written as
the jsonl files a user brings (`data.train_path=<file>`, the default held-out eval split).

    python -m bench.unseen_tasks DIR      # writes DIR/<task>.jsonl for every task

Each has 800 prompts, answers of one character (one token of the built-in tokenizer), and an
answer that depends on the prompt, so no constant answer scores well:

- `pick-digit`: `"5803@2"` -> `"0"`: the digit at the 0-based position after `@`, of four
  digits. Every digit is equally likely: the best constant scores about 0.1.
- `max-digit`: `"274>"` -> `"7"`: the largest of three digits. The best constant (`9`)
  scores about 0.27.
- `next-letter`: `"kqd+"` -> `"l"`: the letter after the first of three letters (a..y). The
  best constant scores about 0.04.

The rows are drawn with a fixed seed per task: the files are the same on every machine.
"""

from __future__ import annotations

import json
import string
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np

SIZE = 800


def _pick_digit(rng: np.random.Generator) -> dict:
    digits = "".join(str(d) for d in rng.integers(0, 10, size=4))
    i = int(rng.integers(0, 4))
    return {"prompt": f"{digits}@{i}", "label": digits[i]}


def _max_digit(rng: np.random.Generator) -> dict:
    digits = [int(d) for d in rng.integers(0, 10, size=3)]
    return {"prompt": "".join(map(str, digits)) + ">", "label": str(max(digits))}


def _next_letter(rng: np.random.Generator) -> dict:
    letters = "".join(string.ascii_lowercase[int(i)] for i in rng.integers(0, 25, size=3))
    return {"prompt": f"{letters}+", "label": chr(ord(letters[0]) + 1)}


TASKS: dict[str, tuple[int, Callable[[np.random.Generator], dict]]] = {
    "pick-digit": (20261205, _pick_digit),
    "max-digit": (20261206, _max_digit),
    "next-letter": (20261207, _next_letter),
}


def task_rows(name: str) -> list[dict]:
    """`SIZE` distinct prompts of task `name`, the same on every call."""
    seed, draw = TASKS[name]
    rng = np.random.default_rng(seed)
    rows: dict[str, dict] = {}
    while len(rows) < SIZE:
        row = draw(rng)
        rows.setdefault(row["prompt"], row)
    return list(rows.values())


def best_constant_score(rows: list[dict]) -> float:
    """The share of rows the most frequent answer is right on."""
    labels = [r["label"] for r in rows]
    return max(labels.count(v) for v in set(labels)) / len(labels)


def write_task(name: str, folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in task_rows(name)))
    return path


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        raise SystemExit(__doc__)
    for name in TASKS:
        path = write_task(name, Path(argv[0]))
        print(
            f"{path}: {SIZE} prompts, best constant answer scores {best_constant_score(task_rows(name)):.3f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
