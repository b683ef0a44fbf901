"""Token-level policy losses, as pure functions of tensors.

Every loss returns a SUM over the masked (response) tokens, never a mean. The caller
divides by the number of response tokens of the whole optimizer step, counted across all
ranks and micro-batches. A per-micro-batch mean would weight tokens differently depending
on how the global batch happens to be split, so the gradient would change with the
micro-batch size and the rank count; sums over a global count make it exact.
"""

from __future__ import annotations

import torch


def token_logprobs(logits: torch.Tensor, targets: torch.Tensor, temperature: float) -> torch.Tensor:
    """log p(target) under softmax(logits / temperature), shape of `targets`.

    The temperature is the sampling one: the engine reports logprobs of the tempered
    distribution it sampled from, and the PPO ratio must compare like with like.
    """
    logp = torch.log_softmax(logits.float() / temperature, dim=-1)
    return logp.gather(-1, targets.unsqueeze(-1)).squeeze(-1)


def entropy_from_logits(logits: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """Entropy of softmax(logits / temperature) per position (shape of logits without the vocab dim)."""
    logp = torch.log_softmax(logits.float() / temperature, dim=-1)
    return -(logp.exp() * logp).sum(-1)


def ppo_clip_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    eps_low: float,
    eps_high: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """PPO-clip surrogate summed over masked tokens, and the number of tokens where clipping bit.

    Per token: max(-A * r, -A * clip(r, 1 - eps_low, 1 + eps_high)), r = exp(logp - old).
    A token counts as clipped when the clipped term is the larger one (its gradient is zero).
    """
    ratio = torch.exp(logprobs - old_logprobs)
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1.0 - eps_low, 1.0 + eps_high)
    mask = mask.to(logprobs.dtype)
    loss_sum = (torch.maximum(unclipped, clipped) * mask).sum()
    clipfrac_sum = ((clipped > unclipped).to(logprobs.dtype) * mask).sum()
    return loss_sum, clipfrac_sum.detach()


def kl_k3(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Schulman's k3 estimator of KL(policy || ref), summed over masked tokens.

    With r = ref_logp - logp per sampled token: exp(r) - r - 1, which is >= 0 and unbiased
    for samples drawn from the policy, unlike the plain log-ratio.
    """
    r = ref_logprobs - logprobs
    return ((torch.exp(r) - r - 1.0) * mask.to(logprobs.dtype)).sum()
