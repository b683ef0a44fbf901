"""What a rollout hands the trainer: plain Python lists, so it travels through Ray's
object store cheaply and imports neither torch nor pandas."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

SampleStatus = Literal["completed", "truncated", "failed", "aborted"]


def weight_version_of(reported: object) -> int:
    """The integer weight version an engine reported for a sample.

    Engines are launched at version 0 and every sync sets the trainer's version; a value
    that is not an integer (SGLang's own initial "default", say) means an engine that was
    not started or synced by this run: say so, rather than fail on int()."""
    try:
        return int(reported)  # type: ignore[call-overload]
    except (TypeError, ValueError):
        raise ValueError(
            f"engine reported weight_version {reported!r}, not a version of this run: an engine "
            "must be launched with --weight-version 0 (as the run launches them) and synced by it"
        ) from None


@dataclass
class Sample:
    prompt: str
    label: str
    response: str
    prompt_ids: list[int]
    response_ids: list[int]
    # per response token, from the engine at the sampling temperature
    engine_logprobs: list[float]
    weight_version: int
    group: int  # index of the prompt within the rollout; samples of one group share a prompt
    status: SampleStatus = "completed"
    reward: float = 0.0
    advantage: float = 0.0
    finish_reason: str = ""
    error: str = ""
    # per response token: 1 sampled by the policy (in the loss), 0 written by the environment
    # (tool output, user turns: never in the loss); None means all 1 (a single-turn sample)
    loss_mask: list[int] | None = None

    @property
    def loss_tokens(self) -> int:
        """Response tokens in the loss: those the policy sampled (none without a prompt)."""
        if not self.prompt_ids:
            return 0
        return sum(self.loss_mask) if self.loss_mask is not None else len(self.response_ids)


def renumbered(groups: list[list[Sample]]) -> list[Sample]:
    """The groups' samples in order, each group numbered by its place."""
    out = []
    for g, group in enumerate(groups):
        for s in group:
            s.group = g
            out.append(s)
    return out


@dataclass
class RolloutBatch:
    rollout_id: int
    samples: list[Sample] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.samples)
