"""The eval sets of a run: rows and sampling settings of each, resolved from the config."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from infra.config import DataConfig, EvalConfig, EvalDataset
from infra.data.prompts import load_rows, with_split
from infra.data.rewards import resolve_reward
from infra.data.splits import sample_rows


@dataclass
class EvalSet:
    name: str  # "" for the single default set (metrics under plain eval_* keys)
    rows: list[dict]
    n_samples: int
    temperature: float
    max_new_tokens: int | None
    reward_fn: Callable | None  # None: the run's reward

    @classmethod
    def default(cls, rows: list[dict], data: DataConfig, e: EvalConfig) -> EvalSet:
        """The single set, of the run's eval rows (`infra.data.splits.train_and_eval_rows`)."""
        return cls(
            "", sample_rows(rows, e.num_prompts, data.shuffle_seed), e.n_samples, e.temperature, None, None
        )

    @classmethod
    def of(cls, d: EvalDataset, data: DataConfig, opts: dict, e: EvalConfig) -> EvalSet:
        rows = load_rows(with_split(d.path, "eval"), data.prompt_key, data.label_key, opts)
        return cls(
            d.name,
            sample_rows(rows, d.num_prompts or e.num_prompts, data.shuffle_seed),
            d.n_samples or e.n_samples,
            e.temperature if d.temperature is None else d.temperature,  # 0 is greedy
            d.max_new_tokens,
            resolve_reward(d.reward, data) if d.reward else None,
        )
