"""Which prompts train and which evaluate: the train/eval split of a run's data, and the
seeded sample of eval prompts an evaluation uses.

Both draws are pure functions of the rows and `data.shuffle_seed`, so every evaluation of
a run, a resumed run and a retried task see the same prompts. Each draw has its own
stream of the seed (numpy SeedSequence entropy `[seed, stream]`), apart from the per-epoch
shuffle's `default_rng(seed + epoch)`.
"""

from __future__ import annotations

import numpy as np

from infra.config import RunConfig
from infra.data.prompts import load_rows, with_split

_HOLDOUT_STREAM = 1
_EVAL_SAMPLE_STREAM = 2


def hold_out(rows: list[dict], fraction: float, seed: int) -> tuple[list[dict], list[dict]]:
    """(train rows, held-out rows): round(fraction x rows), at least one, drawn with `seed`;
    both keep the file's order."""
    n_eval = max(1, round(fraction * len(rows)))
    if len(rows) - n_eval < 1:
        raise ValueError(
            f"data.eval_path is empty and data.train_path holds {len(rows)} row(s): too few to hold out "
            "an eval split and still train; set data.eval_path"
        )
    held = set(np.random.default_rng([seed, _HOLDOUT_STREAM]).permutation(len(rows))[:n_eval].tolist())
    train = [r for i, r in enumerate(rows) if i not in held]
    return train, [r for i, r in enumerate(rows) if i in held]


def train_and_eval_rows(
    cfg: RunConfig, train_file_rows: list[dict], opts: dict
) -> tuple[list[dict], list[dict]]:
    """The rows the run trains on and those of its default eval set, given data.train_path's rows.

    eval rows: data.eval_path's; with it empty, a builtin task's eval split or a held-out split
    of the train rows (`RunConfig.holds_out_eval`); none when eval.datasets replaces the set."""
    d = cfg.data
    if cfg.holds_out_eval:
        return hold_out(train_file_rows, d.eval_holdout_fraction, d.shuffle_seed)
    if d.eval_path is None and not d.train_path.startswith("builtin:"):
        return train_file_rows, []  # eval.datasets are the eval sets
    path = d.train_path if d.eval_path is None else d.eval_path
    return train_file_rows, load_rows(with_split(path, "eval"), d.prompt_key, d.label_key, opts)


def sample_rows(rows: list[dict], k: int, seed: int) -> list[dict]:
    """k of `rows` drawn with `seed` (in the rows' order); all of them when there are no more."""
    if k >= len(rows):
        return rows
    picked = np.random.default_rng([seed, _EVAL_SAMPLE_STREAM]).choice(len(rows), size=k, replace=False)
    return [rows[i] for i in sorted(picked.tolist())]
