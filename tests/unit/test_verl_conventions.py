"""Which verl setting each of our options equals, checked on fixed float64 tensors.

Each `_verl_*` helper below writes out the published formula of the named verl option
(core PPO algorithms, verl 0.4-0.9) in plain torch; the test then checks that our
implementation gives the same numbers. Mapping:

| ours                                   | verl                                                        |
|----------------------------------------|-------------------------------------------------------------|
| grpo (normalize_advantage_std=true)    | adv_estimator=grpo, norm_adv_by_std_in_grpo=True            |
| grpo (normalize_advantage_std=false)   | adv_estimator=grpo, norm_adv_by_std_in_grpo=False           |
| dr_grpo                                | grpo + norm_adv_by_std_in_grpo=False + seq-mean-token-sum-norm (see below) |
| rloo                                   | adv_estimator=rloo                                          |
| reinforce_plus_plus                    | adv_estimator=reinforce_plus_plus, gamma=1                  |
| reinforce_plus_plus_baseline           | adv_estimator=reinforce_plus_plus_baseline                  |
| gspo                                   | policy_loss.loss_mode=gspo, loss_agg_mode=seq-mean-token-mean |
| PPO-clip, clip_ratio_c=3 (default)     | policy_loss.loss_mode=vanilla, clip_ratio_c=3.0             |
| kl_type k1 / k2 / k3 = low_var_kl      | kl_loss_type kl(k1) / mse(k2) / low_var_kl(k3)              |
| kl_in_reward                           | use_kl_in_reward=True with a fixed kl_ctrl                  |
| loss_agg_mode token-mean, seq-mean-*   | the same loss_agg_mode on one micro-batch                   |
| tis_cap                                | actor.tis_imp_ratio_cap                                     |

One difference is by design: verl's seq-mean-token-sum-norm divides the summed token
losses by the response length only; ours also divides by the number of sequences (Dr.
GRPO's 1/G), so ours x B equals verl's for a batch of B sequences.
"""

from __future__ import annotations

import pytest
import torch

from infra.algorithms.advantages import compute_advantages
from infra.trainer.losses import aggregation_weights, kl_penalty, policy_loss, tis_weights

D = torch.float64
REWARDS = [1.0, 0.0, 0.0, 1.0, 0.5, 3.0, 5.0, 2.5, 1.0, 1.0, 1.0]
GROUPS = [0, 0, 0, 0, 0, 1, 1, 2, 3, 3, 3]  # group 2 is a lone sample, group 3 is flat
LENGTHS = [3, 1, 4, 2, 2, 5, 1, 3, 2, 2, 4]
T = max(LENGTHS)
MASK = torch.tensor([[1.0] * n + [0.0] * (T - n) for n in LENGTHS], dtype=D)


def _by_group(scores):
    out: dict[int, list[int]] = {}
    for i, g in enumerate(GROUPS):
        out.setdefault(g, []).append(i)
    return {g: scores[idx] for g, idx in out.items()}


def _verl_grpo(norm: bool, eps: float = 1e-6) -> torch.Tensor:
    scores = torch.tensor(REWARDS, dtype=D)
    stats = {}
    for g, vals in _by_group(scores).items():
        # a lone sample: mean 0, std 1; otherwise torch.mean and the unbiased torch.std
        stats[g] = (
            (torch.tensor(0.0, dtype=D), torch.tensor(1.0, dtype=D))
            if len(vals) == 1
            else (vals.mean(), vals.std())
        )
    out = torch.stack(
        [
            (s - stats[g][0]) / (stats[g][1] + eps) if norm else s - stats[g][0]
            for s, g in zip(scores, GROUPS, strict=True)
        ]
    )
    return out.unsqueeze(-1) * MASK


def _verl_rloo() -> torch.Tensor:
    scores = torch.tensor(REWARDS, dtype=D)
    groups = _by_group(scores)
    out = []
    for s, g in zip(scores, GROUPS, strict=True):
        n = len(groups[g])
        out.append(s if n == 1 else s * n / (n - 1) - groups[g].mean() * n / (n - 1))
    return torch.stack(out).unsqueeze(-1) * MASK


def _masked_whiten(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    mean = (values * mask).sum() / mask.sum()
    var = (((values - mean) ** 2) * mask).sum() / mask.sum()
    var = var * mask.sum() / (mask.sum() - 1)  # Bessel's correction over the tokens
    return (values - mean) * torch.rsqrt(var + 1e-8)


def _verl_reinforce_pp(baseline: bool) -> torch.Tensor:
    scores = torch.tensor(REWARDS, dtype=D)
    if baseline:
        groups = _by_group(scores)
        scores = torch.stack(
            [
                s - (groups[g].mean() if len(groups[g]) > 1 else 0.0)
                for s, g in zip(scores, GROUPS, strict=True)
            ]
        )
        returns = scores.unsqueeze(-1) * MASK
    else:  # the outcome reward sits on the last response token; returns with gamma = 1
        token_rewards = torch.zeros_like(MASK)
        for i, n in enumerate(LENGTHS):
            token_rewards[i, n - 1] = scores[i]
        returns = torch.zeros_like(MASK)
        running = torch.zeros(len(LENGTHS), dtype=D)
        for t in reversed(range(T)):
            running = token_rewards[:, t] + 1.0 * running
            returns[:, t] = running
            running = running * MASK[:, t]
    return _masked_whiten(returns, MASK) * MASK


def _ours(estimator: str, **kw) -> torch.Tensor:
    adv = compute_advantages(estimator, REWARDS, GROUPS, LENGTHS, **kw)
    return torch.tensor(adv, dtype=D).unsqueeze(-1) * MASK


@pytest.mark.parametrize(
    "ours,verl",
    [
        (lambda: _ours("grpo"), lambda: _verl_grpo(norm=True)),
        (lambda: _ours("grpo", normalize_std=False), lambda: _verl_grpo(norm=False)),
        (lambda: _ours("dr_grpo"), lambda: _verl_grpo(norm=False)),
        (lambda: _ours("rloo"), _verl_rloo),
        (lambda: _ours("reinforce_plus_plus"), lambda: _verl_reinforce_pp(baseline=False)),
        (lambda: _ours("reinforce_plus_plus_baseline"), lambda: _verl_reinforce_pp(baseline=True)),
    ],
    ids=["grpo", "grpo-no-std", "dr_grpo", "rloo", "reinforce_plus_plus", "reinforce_plus_plus_baseline"],
)
def test_advantages_equal_verl(ours, verl):
    torch.testing.assert_close(ours(), verl(), rtol=1e-12, atol=1e-12)


# --- losses ------------------------------------------------------------------------------


def _tensors(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(len(LENGTHS), T, generator=g, dtype=D) * 3
    # log-ratios ~ N(0, 1.5^2): many ratios outside the clip range, some above the dual clip's 3
    logp = old + torch.randn(len(LENGTHS), T, generator=g, dtype=D) * 1.5
    adv = torch.randn(len(LENGTHS), 1, generator=g, dtype=D)
    return logp, old, adv


def _verl_agg(loss: torch.Tensor, mask: torch.Tensor, mode: str) -> torch.Tensor:
    if mode == "token-mean":
        return (loss * mask).sum() / mask.sum()
    if mode == "seq-mean-token-sum":
        return (loss * mask).sum(-1).mean()
    if mode == "seq-mean-token-mean":
        return ((loss * mask).sum(-1) / mask.sum(-1)).mean()
    return (loss * mask).sum() / mask.shape[-1]  # seq-mean-token-sum-norm


def _ours_agg(loss: torch.Tensor, mode: str) -> torch.Tensor:
    return (loss * aggregation_weights(MASK, mode, MASK.sum().item(), len(LENGTHS), T)).sum()


def _verl_vanilla(logp, old, adv, eps_low=0.2, eps_high=0.28, c=3.0):
    ratio = torch.exp(torch.clamp(logp - old, -20.0, 20.0))
    l1, l2 = -adv * ratio, -adv * torch.clamp(ratio, 1 - eps_low, 1 + eps_high)
    clip1 = torch.maximum(l1, l2)
    l3 = -adv * c
    loss = torch.where(adv < 0, torch.minimum(l3, clip1), clip1)
    clipfrac = ((l2 > l1).to(D) * MASK).sum() / MASK.sum()
    clipfrac_lower = ((clip1 > l3) & (adv < 0)).to(D).mul(MASK).sum() / MASK.sum()
    return loss, clipfrac, clipfrac_lower


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"])
def test_vanilla_ppo_loss_and_gradient_equal_verl(mode):
    logp, old, adv = _tensors()
    a, b = logp.clone().requires_grad_(), logp.clone().requires_grad_()
    verl_loss, verl_clipfrac, verl_lower = _verl_vanilla(a, old, adv)
    ours = policy_loss(b, old, adv, MASK, 0.2, 0.28, 3.0)
    v, o = _verl_agg(verl_loss, MASK, mode), _ours_agg(ours.loss, mode)
    torch.testing.assert_close(o, v, rtol=1e-12, atol=1e-12)
    v.backward()
    o.backward()
    torch.testing.assert_close(b.grad, a.grad, rtol=1e-12, atol=1e-12)
    n = MASK.sum()
    assert ((ours.clipped_high + ours.clipped_low) * MASK).sum() / n == pytest.approx(verl_clipfrac.item())
    assert (ours.dual_clipped * MASK).sum() / n == pytest.approx(verl_lower.item())
    assert verl_clipfrac > 0 and verl_lower > 0  # the tensors exercise both clips


def test_seq_mean_token_sum_norm_is_verl_over_batch_size():
    logp, old, adv = _tensors(1)
    loss = policy_loss(logp, old, adv, MASK, 0.2, 0.2).loss
    ours = _ours_agg(loss, "seq-mean-token-sum-norm")
    torch.testing.assert_close(ours * len(LENGTHS), _verl_agg(loss, MASK, "norm"), rtol=1e-12, atol=1e-12)


def test_gspo_equals_verl():
    logp, old, adv = _tensors(2)
    logp = old + (logp - old) * 0.01  # GSPO's clip range is tiny: keep some sequences inside it
    a, b = logp.clone().requires_grad_(), logp.clone().requires_grad_()
    seq = ((a - old) * MASK).sum(-1) / MASK.sum(-1)
    log_ratio = torch.clamp(a - a.detach() + seq.detach().unsqueeze(-1), max=10.0)
    ratio = torch.exp(log_ratio)
    verl_loss = torch.maximum(-adv * ratio, -adv * torch.clamp(ratio, 1 - 3e-4, 1 + 4e-4))
    v = _verl_agg(verl_loss, MASK, "seq-mean-token-mean")
    o = _ours_agg(
        policy_loss(b, old, adv, MASK, 3e-4, 4e-4, 3.0, sequence_level=True).loss, "seq-mean-token-mean"
    )
    torch.testing.assert_close(o, v, rtol=1e-12, atol=1e-12)
    v.backward()
    o.backward()
    torch.testing.assert_close(b.grad, a.grad, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize(
    "ours,verl", [("k1", "kl"), ("k2", "mse"), ("k3", "low_var_kl"), ("low_var_kl", "low_var_kl")]
)
def test_kl_types_equal_verl(ours, verl):
    logp, _, _ = _tensors(3)
    ref = logp + torch.randn_like(logp) * 4  # wide enough that the +-10 cap of low_var_kl bites
    if verl == "kl":
        expected = logp - ref
    elif verl == "mse":
        expected = 0.5 * (logp - ref).square()
    else:
        kl = torch.clamp(ref - logp, -20, 20)
        expected = torch.clamp(torch.exp(kl) - kl - 1, -10, 10)
        assert (expected == 10).any()
    torch.testing.assert_close(kl_penalty(logp, ref, ours), expected, rtol=0, atol=0)


def test_tis_equals_verl_imp_ratio_cap():
    logp, old, adv = _tensors(4)
    engine = old + torch.randn_like(old) * 0.7
    pg = policy_loss(logp, old, adv, MASK, 0.2, 0.2, 3.0).loss
    verl = pg * torch.clamp(torch.exp(old - engine), max=2.0)
    torch.testing.assert_close(pg * tis_weights(old, engine, 2.0), verl, rtol=1e-12, atol=1e-12)
