"""The eval sets of a run: rows and sampling settings of each, resolved from the config."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from infra.config import DataConfig, EvalConfig, EvalDataset
from infra.data.prompts import load_rows, with_split
from infra.data.rewards import resolve_reward


@dataclass
class EvalSet:
    name: str  # "" for the single default set (metrics under plain eval_* keys)
    rows: list[dict]
    n_samples: int
    temperature: float
    max_new_tokens: int | None
    reward_fn: Callable | None  # None: the run's reward

    @classmethod
    def default(cls, data: DataConfig, opts: dict, e: EvalConfig) -> EvalSet:
        rows = load_rows(with_split(data.eval_path, "eval"), data.prompt_key, data.label_key, opts)
        return cls("", rows[: e.num_prompts], e.n_samples, e.temperature, None, None)

    @classmethod
    def of(cls, d: EvalDataset, data: DataConfig, opts: dict, e: EvalConfig) -> EvalSet:
        rows = load_rows(with_split(d.path, "eval"), data.prompt_key, data.label_key, opts)
        return cls(
            d.name,
            rows[: d.num_prompts or e.num_prompts],
            d.n_samples or e.n_samples,
            e.temperature if d.temperature is None else d.temperature,  # 0 is greedy
            d.max_new_tokens,
            resolve_reward(d.reward, data) if d.reward else None,
        )
