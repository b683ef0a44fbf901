"""Token-level policy losses, KL estimators and loss aggregation, as pure functions of tensors.

Losses come back as per-token matrices; `aggregation_weights` turns them into one number
with counts taken over the whole optimizer step (all ranks and micro-batches). A
per-micro-batch mean would weight tokens differently depending on how the global batch
happens to be split, so the gradient would change with the micro-batch size and the rank
count; weights from global counts make it exact.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

# exp() of a log-ratio past +-20 overflows float32 in the loss and its gradient: clamp it.
LOG_RATIO_CLAMP = 20.0
# The k3 estimator explodes for tokens the reference finds very unlikely: cap each token.
KL_CLAMP = 10.0
# GSPO's sequence log-ratio is capped from above only.
SEQ_LOG_RATIO_MAX = 10.0


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


@dataclass
class PolicyLoss:
    loss: torch.Tensor  # [B, T] per-token loss (unmasked; aggregate with the mask's weights)
    clipped_high: torch.Tensor  # [B, T] 1 where A > 0 and the ratio was clipped at 1 + eps_high
    clipped_low: torch.Tensor  # [B, T] 1 where A < 0 and the ratio was clipped at 1 - eps_low
    dual_clipped: torch.Tensor  # [B, T] 1 where A < 0 and the loss was capped at -A * clip_ratio_c
    # [B, T] old logp - logp, the token log-ratio negated (clamped as in the PPO ratio; GSPO's
    # unclamped): verl's `ppo_kl` is its mean over the response tokens
    ppo_kl: torch.Tensor


def sequence_log_ratio(
    logprobs: torch.Tensor, old_logprobs: torch.Tensor, mask: torch.Tensor
) -> torch.Tensor:
    """GSPO's per-token log-ratio: the sequence's mean log-ratio as its value, each token's own
    log-prob as its gradient (logp - sg(logp) + sg(mean_t(logp - old))), capped at +10."""
    mask = mask.to(logprobs.dtype)
    seq = ((logprobs - old_logprobs) * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)
    log_ratio = logprobs - logprobs.detach() + seq.detach().unsqueeze(-1)
    return torch.clamp(log_ratio, max=SEQ_LOG_RATIO_MAX)


def policy_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    eps_low: float,
    eps_high: float,
    clip_ratio_c: float | None = None,
    sequence_level: bool = False,
) -> PolicyLoss:
    """PPO-clip per token, with an optional dual clip, or GSPO's sequence-level ratio.

    Per token, r = exp(clamp(logp - old, +-20)):
        L = max(-A r, -A clip(r, 1 - eps_low, 1 + eps_high)),
    and with dual clip, for A < 0 only: L = min(L, -A c). `sequence_level` (GSPO) replaces
    the log-ratio by `sequence_log_ratio` and has no dual clip.
    """
    if sequence_level:
        log_ratio = sequence_log_ratio(logprobs, old_logprobs, mask)
        ppo_kl = old_logprobs - logprobs
    else:
        log_ratio = torch.clamp(logprobs - old_logprobs, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
        ppo_kl = -log_ratio
    ratio = torch.exp(log_ratio)
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1.0 - eps_low, 1.0 + eps_high)
    loss = torch.maximum(unclipped, clipped)
    bit = (clipped > unclipped).detach()
    negative = (advantages < 0).expand_as(loss)
    dual = torch.zeros_like(bit)
    if clip_ratio_c is not None and not sequence_level:
        cap = -advantages * clip_ratio_c
        dual = (negative & (loss > cap)).detach()
        loss = torch.where(negative, torch.minimum(loss, cap), loss)
    dtype = logprobs.dtype
    return PolicyLoss(
        loss=loss,
        clipped_high=(bit & ~negative).to(dtype),
        clipped_low=(bit & negative).to(dtype),
        dual_clipped=dual.to(dtype),
        ppo_kl=ppo_kl.detach(),
    )


def kl_penalty(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, kind: str) -> torch.Tensor:
    """Per-token estimate of KL(policy || ref) from the sampled tokens' logprobs.

    k1 = logp - ref (unbiased, can be negative); k2 = (logp - ref)^2 / 2; k3 (= low_var_kl)
    = exp(d) - d - 1 with d = ref - logp clamped to +-20, the result clamped to +-10
    (unbiased before clamping, always >= 0, low variance: Schulman's estimators).
    """
    if kind == "k1":
        return logprobs - ref_logprobs
    if kind == "k2":
        return 0.5 * (logprobs - ref_logprobs).square()
    if kind in ("k3", "low_var_kl"):
        d = torch.clamp(ref_logprobs - logprobs, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
        return torch.clamp(torch.exp(d) - d - 1.0, -KL_CLAMP, KL_CLAMP)
    raise ValueError(f"algorithm.kl_type={kind!r} is not one of k1, k2, k3, low_var_kl")


def mean_sequence_kl(seq_kl: torch.Tensor, seq_tokens: torch.Tensor) -> float:
    """verl's `reward_kl_penalty` metric: each sequence's summed KL over its loss tokens divided
    by their count (+1e-8, verl's masked mean: a sequence without tokens counts 0), averaged
    over the sequences. The coefficient is not in it (verl reports it as `_coeff`)."""
    return float((seq_kl / (seq_tokens + 1e-8)).mean())


def tis_weights(old_logprobs: torch.Tensor, engine_logprobs: torch.Tensor, cap: float) -> torch.Tensor:
    """Truncated importance weights min(pi_old / pi_engine, cap) per token, without gradient.

    The engine sampled the tokens (the behaviour policy); the trainer's old policy is what
    the PPO ratio is relative to. The cap bounds the variance a rare token can add.
    """
    log_w = torch.clamp(old_logprobs - engine_logprobs, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    return torch.clamp(torch.exp(log_w), max=cap).detach()


def aggregation_weights(
    mask: torch.Tensor, mode: str, num_tokens: float, num_seqs: float, max_len: int
) -> torch.Tensor:
    """Per-token weights w so that sum(loss * w) over the whole step is the `mode` aggregate.

    `num_tokens` and `num_seqs` count the response tokens and the sequences with at least
    one response token in the WHOLE optimizer step (all ranks, all micro-batches):
      token-mean:              w = m / N_tokens
      seq-mean-token-mean:     w = m / ((n_i + 1e-8) N_seqs) (n_i: tokens of sequence i; + 1e-8 as verl)
      seq-mean-token-sum:      w = m / N_seqs
      seq-mean-token-sum-norm: w = m / (N_seqs max_len)      (Dr. GRPO's constant length)
    """
    mask = mask if mask.is_floating_point() else mask.float()
    tokens, seqs = max(num_tokens, 1.0), max(num_seqs, 1.0)
    if mode == "token-mean":
        return mask / tokens
    if mode == "seq-mean-token-mean":
        return mask / ((mask.sum(-1, keepdim=True) + 1e-8) * seqs)
    if mode == "seq-mean-token-sum":
        return mask / seqs
    if mode == "seq-mean-token-sum-norm":
        return mask / (seqs * max_len)
    raise ValueError(f"algorithm.loss_agg_mode={mode!r} is unknown")
