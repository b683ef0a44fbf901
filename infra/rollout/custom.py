"""Custom rollout functions: multi-turn and tool-use rollouts as plug-ins.

`rollout.generate_fn: module:function` (or `file.py:function`) replaces the manager's
single-turn sampling of a prompt group. It receives a `GroupRequest` (the prompt, its
token ids, the label, n, sampling parameters, one seed and rid per sample, an engine
client and the tokenizer) and returns n `Trajectory` objects: the response tokens it
built turn by turn, with `loss_mask` 1 on tokens the policy sampled and 0 on tokens the
environment wrote (tool output, user turns), which the trainer leaves out of the loss.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from infra.engines.client import EngineClient


@dataclass
class GroupRequest:
    prompt: str
    prompt_ids: list[int]
    label: str
    n: int
    sampling_params: dict
    seeds: list[int]  # one per sample: pass them as each turn's sampling_seed
    rids: list[str]  # one per sample
    engine: EngineClient
    tokenizer: Any


@dataclass
class Trajectory:
    response_ids: list[int]
    loss_mask: list[int]  # per response token: 1 sampled by the policy, 0 written by the environment
    engine_logprobs: list[float]  # per response token; anything (e.g. 0.0) where loss_mask is 0
    weight_version: int  # the oldest weights any of its turns was sampled with
    finish_reason: str = "stop"
    info: dict = field(default_factory=dict)

    def check(self) -> None:
        r = len(self.response_ids)
        if len(self.loss_mask) != r or len(self.engine_logprobs) != r:
            raise ValueError(
                f"rollout.generate_fn: a trajectory has {r} response tokens but {len(self.loss_mask)} "
                f"loss_mask and {len(self.engine_logprobs)} engine_logprobs entries"
            )
        if any(m not in (0, 1) for m in self.loss_mask):
            raise ValueError("rollout.generate_fn: loss_mask entries must be 0 or 1")


GenerateFn = Callable[[GroupRequest], list[Trajectory]]


def resolve_generate_fn(spec: str) -> GenerateFn:
    from infra.data.rewards import load_callable

    return load_callable(spec, "rollout.generate_fn", " (expected `module:function` or `file.py:function`)")


def turn(
    engine: EngineClient, inputs: list[list[int]], params: dict, seeds: list[int], rids: list[str]
) -> list[dict]:
    """One turn for every sample: each its own input, seed and rid (as the manager sends them)."""
    return engine.generate(inputs, [{**params, "sampling_seed": s} for s in seeds], rid=rids)
