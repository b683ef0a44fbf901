"""PPO's per-token targets over a whole rollout: token rewards, GAE advantages and returns.

The actor and the critic shard a rollout differently (their own ranks and micro-batches),
so what they exchange is in RESPONSE coordinates: a [num_samples, longest response] tensor
whose row i, column j belongs to response token j of sample i. Both sides compute the
targets from the same inputs with the same function, so they agree exactly.

In a micro-batch, response token j of a sample with a p-token prompt sits at position
p + j - 1 of the [B, T-1] tensors (the logits at position t predict token t + 1), which
is also where the critic's value of that token is read.
"""

from __future__ import annotations

import torch

from infra.rollout.batch import Sample
from infra.trainer.batches import MicroBatch
from infra.trainer.critic_losses import gae


def response_width(samples: list[Sample]) -> int:
    return max([1, *(len(s.response_ids) for s in samples)])


def response_mask(samples: list[Sample]) -> torch.Tensor:
    """[N, L]: 1 on response tokens in the loss (none for a sample without prompt or response)."""
    mask = torch.zeros(len(samples), response_width(samples))
    for i, s in enumerate(samples):
        r = len(s.response_ids)
        if r and s.prompt_ids:
            mask[i, :r] = torch.tensor(s.loss_mask, dtype=torch.float32) if s.loss_mask is not None else 1.0
    return mask


def _spans(mb: MicroBatch, samples: list[Sample]):
    for row, i in enumerate(mb.index):
        s = samples[i]
        p, r = len(s.prompt_ids), len(s.response_ids)
        if p and r:
            yield row, i, p - 1, r


def to_response(per_position: torch.Tensor, mb: MicroBatch, samples: list[Sample], out: torch.Tensor) -> None:
    """Write a micro-batch's [B, T-1] values into the rows of `out` ([N, L]) it holds."""
    for row, i, start, r in _spans(mb, samples):
        out[i, :r] = per_position[row, start : start + r]


def to_positions(per_token: torch.Tensor, mb: MicroBatch, samples: list[Sample]) -> torch.Tensor:
    """The micro-batch's [B, T-1] view of a [N, L] response-coordinate tensor (0 elsewhere)."""
    out = torch.zeros_like(mb.mask)
    for row, i, start, r in _spans(mb, samples):
        out[row, start : start + r] = per_token[i, :r].to(out.device)
    return out * mb.mask


def token_rewards(
    samples: list[Sample], mask: torch.Tensor, kl: torch.Tensor | None = None, kl_coef: float = 0.0
) -> torch.Tensor:
    """[N, L]: each sample's reward on its last response token in the loss; with `kl` (per token,
    the policy's KL to the reference) minus kl_coef x kl on every token, as verl's kl-in-reward."""
    rewards = torch.zeros_like(mask)
    for i, s in enumerate(samples):
        tokens = mask[i].nonzero()
        if len(tokens):
            rewards[i, int(tokens[-1])] = s.reward
    if kl is not None:
        rewards = rewards - kl_coef * kl.to(rewards.device) * mask
    return rewards


def ppo_targets(
    samples: list[Sample],
    values: torch.Tensor,
    gamma: float,
    lam: float,
    kl: torch.Tensor | None = None,
    kl_coef: float = 0.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(advantages whitened over the rollout's response tokens, returns), both [N, L] and masked."""
    mask = response_mask(samples).to(values.device)
    rewards = token_rewards(samples, mask, kl, kl_coef)
    if mask.sum() < 2:  # no variance to whiten by: nothing to learn from this rollout
        return torch.zeros_like(mask), (rewards * mask)
    advantages, returns = gae(rewards, values * mask, mask, gamma, lam)
    return advantages, returns * mask


def as_lists(per_token: torch.Tensor, samples: list[Sample]) -> list[list[float]]:
    """Plain lists (one per sample, its response length): what travels between the groups."""
    return [per_token[i, : len(s.response_ids)].tolist() for i, s in enumerate(samples)]


def from_lists(
    rows: list[list[float]], samples: list[Sample], device: torch.device | str = "cpu"
) -> torch.Tensor:
    out = torch.zeros(len(samples), response_width(samples), device=device)
    for i, row in enumerate(rows):
        if row:
            out[i, : len(row)] = torch.tensor(row, device=device)
    return out
