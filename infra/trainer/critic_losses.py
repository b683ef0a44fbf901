"""The critic's numerics: GAE advantages and returns, and the clipped value loss.

Pure tensor functions, tested on their own; `ppo_targets` and `critic_step` use them.
"""

from __future__ import annotations

import torch

from infra.trainer.losses import aggregation_weights


def masked_whiten(values: torch.Tensor, mask: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """(v - mean) / sqrt(var + eps) over the masked entries; var unbiased over their count."""
    n = mask.sum()
    if n < 2:
        raise ValueError("whitening needs at least 2 masked entries")
    mean = (values * mask).sum() / n
    var = (((values - mean) ** 2) * mask).sum() / (n - 1)
    return (values - mean) * torch.rsqrt(var + eps)


def gae(
    rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, gamma: float, lam: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation over response tokens: (whitened advantages, returns).

    delta_t = r_t + gamma V_{t+1} - V_t, A_t = delta_t + gamma lam A_{t+1}, where t + 1 is
    the next RESPONSE token (masked positions are skipped, carrying V and A through) and
    both are 0 after the last one. Returns = A + V before whitening (the critic's target).
    """
    next_value = torch.zeros_like(values[:, 0])
    last = torch.zeros_like(values[:, 0])
    out = []
    for t in reversed(range(values.shape[1])):
        m = mask[:, t]
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        adv = delta + gamma * lam * last
        next_value = values[:, t] * m + (1 - m) * next_value
        last = adv * m + (1 - m) * last
        out.append(last)
    advantages = torch.stack(out[::-1], dim=1)
    returns = advantages + values
    return masked_whiten(advantages, mask) * mask, returns


def clipped_value_loss(
    vpreds: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    mask: torch.Tensor,
    clip: float,
    mode: str = "token-mean",
    counts: tuple[float, float, int] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """0.5 x aggregate of max((V - R)^2, (clip(V, V_old +- clip) - R)^2), and the clipped fraction.

    The aggregate's counts come from `mask` (one batch), or from `counts` = (tokens,
    sequences, max length) of a whole optimizer step when the batch is one micro-batch of it.
    The fraction counts tokens where the clipped error is larger. The clip bounds V itself
    (verl's `clip_by_value`): inside them the clipped V is V to the bit, whereas
    V_old + clamp(V - V_old) can round off it by an ulp and count a token as clipped.
    """
    clipped = torch.max(torch.min(vpreds, old_values + clip), old_values - clip)
    plain_err, clip_err = (vpreds - returns) ** 2, (clipped - returns) ** 2
    if counts is None:
        counts = (float(mask.sum()), float((mask.sum(-1) > 0).sum()), mask.shape[-1])
    w = aggregation_weights(mask, mode, *counts)
    loss = 0.5 * (torch.maximum(plain_err, clip_err) * w).sum()
    frac = ((clip_err > plain_err).to(mask.dtype) * mask).sum() / mask.sum().clamp(min=1)
    return loss, frac.detach()
