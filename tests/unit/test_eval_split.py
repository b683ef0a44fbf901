"""Which rows train and which evaluate (infra/data/splits.py): the held-out split of a train
file when data.eval_path is empty, and the seeded sample of eval.num_prompts."""

from __future__ import annotations

import json

import pytest

from infra.config_files import load_config
from infra.data.prompts import load_rows
from infra.data.splits import hold_out, sample_rows, train_and_eval_rows
from infra.rollout.eval_sets import EvalSet

ROWS = [{"prompt": f"{i}:", "label": str(i % 10)} for i in range(100)]


def test_the_held_out_split_is_seeded_disjoint_and_in_file_order():
    train, held = hold_out(ROWS, 0.05, seed=7)
    assert len(held) == 5 and len(train) == 95
    assert {r["prompt"] for r in train}.isdisjoint(r["prompt"] for r in held)
    assert sorted(train + held, key=lambda r: int(r["prompt"][:-1])) == ROWS
    assert held == sorted(held, key=lambda r: int(r["prompt"][:-1]))
    assert hold_out(ROWS, 0.05, seed=7) == (train, held)
    assert hold_out(ROWS, 0.05, seed=8)[1] != held
    assert held != ROWS[:5] and held != ROWS[-5:]  # drawn, not the file's ends


def test_a_tiny_file_holds_out_one_row_or_asks_for_eval_path():
    assert [len(part) for part in hold_out(ROWS[:3], 0.05, 0)] == [2, 1]
    with pytest.raises(ValueError, match="set data.eval_path"):
        hold_out(ROWS[:1], 0.05, 0)


def test_the_eval_sample_is_seeded_and_the_same_at_every_call():
    picked = sample_rows(ROWS, 8, seed=7)
    assert len(picked) == 8 and picked == sample_rows(ROWS, 8, seed=7)
    assert picked != ROWS[:8] and picked != sample_rows(ROWS, 8, seed=8)
    assert sample_rows(ROWS[:5], 8, seed=7) == ROWS[:5]  # fewer rows than asked: all, in order


def _cfg(tmp_path, *overrides):
    path = tmp_path / "train.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    return load_config(None, [f"data.train_path={path}", *overrides])


def test_a_train_file_without_eval_path_evaluates_on_held_out_rows(tmp_path):
    cfg = _cfg(tmp_path, "seed=3")
    assert cfg.holds_out_eval
    train, evals = train_and_eval_rows(cfg, ROWS, {})
    assert (train, evals) == hold_out(ROWS, 0.05, cfg.data.shuffle_seed)
    # eval.num_prompts samples the held-out rows with the same seed, every evaluation alike
    es = EvalSet.default(evals, cfg.data, load_config(None, ["eval.num_prompts=3"]).eval)
    assert len(es.rows) == 3 and all(r in evals for r in es.rows)
    assert es.rows == EvalSet.default(evals, cfg.data, load_config(None, ["eval.num_prompts=3"]).eval).rows


def test_eval_path_builtin_tasks_and_eval_datasets_hold_nothing_out(tmp_path):
    explicit = _cfg(tmp_path, f"data.eval_path={tmp_path / 'train.jsonl'}")
    assert train_and_eval_rows(explicit, ROWS, {}) == (ROWS, ROWS)
    builtin = load_config(None, [])  # builtin:digit-copy: its own eval split
    train, evals = train_and_eval_rows(builtin, ROWS, {})
    assert train == ROWS and evals == load_rows("builtin:digit-copy:eval", "prompt", "label", {})
    other_sets = _cfg(tmp_path, "eval.datasets=[{name: b, path: 'builtin:digit-copy'}]")
    assert not other_sets.holds_out_eval and train_and_eval_rows(other_sets, ROWS, {}) == (ROWS, [])
