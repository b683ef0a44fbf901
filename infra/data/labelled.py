"""Labelled rows for supervised fine-tuning, as token ids: the prompt exactly as a rollout
formats it (chat template, system prompt, length limit), the answer as the response."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING

from infra.config import RunConfig
from infra.data.prompts import load_rows, with_split
from infra.data.splits import train_and_eval_rows
from infra.data.templating import PromptFormatter

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


@dataclass(frozen=True)
class Example:
    prompt_ids: list[int]
    answer_ids: list[int]


def sft_data_path(cfg: RunConfig) -> str:
    """`sft.data_path`, or the labelled split of the built-in task data.train_path names."""
    path = cfg.sft.data_path
    if path:
        return with_split(path, "sft")
    train = cfg.data.train_path
    if not train.startswith("builtin:"):
        raise ValueError(
            f"sft.data_path is empty and data.train_path={train!r} is no built-in task: "
            "name a file of labelled (prompt, answer) rows"
        )
    name = train.removeprefix("builtin:").partition(":")[0]
    return f"builtin:{name}:sft"


def sft_rows(cfg: RunConfig, storage_options: dict) -> tuple[list[dict], int]:
    """Rows `{"prompt", "label"}` (the label is the answer), and how many rows were left out
    because the run evaluates on their prompt: SFT never trains on an eval prompt, also where
    the eval set is held out of the same file or the labelled file holds eval prompts."""
    rows = load_rows(sft_data_path(cfg), cfg.data.prompt_key, cfg.sft.answer_key, storage_options)
    evaluated = eval_prompts(cfg, storage_options)
    kept = [r for r in rows if _key(r["prompt"]) not in evaluated]
    return kept, len(rows) - len(kept)


def eval_prompts(cfg: RunConfig, storage_options: dict) -> set[str]:
    """The prompts of every eval set of the run (the default one and eval.datasets)."""
    d = cfg.data
    train = load_rows(with_split(d.train_path, "train"), d.prompt_key, d.label_key, storage_options)
    _, rows = train_and_eval_rows(cfg, train, storage_options)
    for ds in cfg.eval.datasets:
        rows = rows + load_rows(with_split(ds.path, "eval"), d.prompt_key, d.label_key, storage_options)
    return {_key(r["prompt"]) for r in rows}


def _key(prompt: str | list[dict]) -> str:
    return prompt if isinstance(prompt, str) else json.dumps(prompt, sort_keys=True)


def tokenize_examples(
    cfg: RunConfig, rows: list[dict], tokenizer: PreTrainedTokenizerBase
) -> tuple[list[Example], int]:
    """The examples, and how many rows were dropped (a prompt over data.max_prompt_len with
    `overlong_prompt: drop`, or an answer with no tokens)."""
    data = cfg.data
    formatter = PromptFormatter(
        tokenizer, data.apply_chat_template, data.system_prompt, data.max_prompt_len, data.overlong_prompt
    )
    eos = [tokenizer.eos_token_id] if cfg.sft.append_eos and tokenizer.eos_token_id is not None else []
    examples, dropped = [], 0
    for row in rows:
        prompt = formatter.ids(row["prompt"])
        answer = tokenizer.encode(row["label"], add_special_tokens=False)
        if prompt is None or not answer:
            dropped += 1
            continue
        examples.append(Example(prompt, answer + eos))
    return examples, dropped
