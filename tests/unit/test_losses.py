"""Losses, KL estimators and aggregation against values (and gradients) derived by hand."""

import math

import pytest
import torch

from infra.trainer.losses import (
    aggregation_weights,
    entropy_from_logits,
    kl_penalty,
    policy_loss,
    tis_weights,
    token_logprobs,
)

D = torch.float64


def _pl(ratios, advantages, mask=None, eps_low=0.2, eps_high=0.2, c=None, grad=False):
    logp = torch.log(torch.tensor(ratios, dtype=D)).requires_grad_(grad)
    mask = torch.tensor(mask if mask is not None else [1.0] * len(ratios), dtype=D)
    out = policy_loss(
        logp, torch.zeros(len(ratios), dtype=D), torch.tensor(advantages, dtype=D), mask, eps_low, eps_high, c
    )
    return logp, out, (out.loss * mask).sum()


def test_ratio_inside_clip_range_is_plain_surrogate():
    # L = -A r per token: -2 x 1.1 + 1 x 0.9
    _, out, total = _pl([1.1, 0.9], [2.0, -1.0])
    assert total.item() == pytest.approx(-2.2 + 0.9)
    assert out.clipped_high.sum() == 0 and out.clipped_low.sum() == 0


def test_positive_advantage_clipped_above():
    # r = 1.5 > 1.2, A = 2: L = max(-3, -2.4) = -2.4, the clipped term bites (high side)
    _, out, total = _pl([1.5], [2.0])
    assert total.item() == pytest.approx(-2.4)
    assert out.clipped_high.tolist() == [1.0] and out.clipped_low.tolist() == [0.0]
    # r = 0.5 < 0.8 with A > 0: max(-1, -1.6) = -1, the unclipped (pessimistic) term, no clip
    _, out, total = _pl([0.5], [2.0])
    assert total.item() == pytest.approx(-1.0) and out.clipped_high.sum() == 0


def test_negative_advantage_clipped_below():
    # r = 0.5, A = -1: max(0.5, 0.8) = 0.8, clipped on the low side
    _, out, total = _pl([0.5], [-1.0])
    assert total.item() == pytest.approx(0.8)
    assert out.clipped_low.tolist() == [1.0] and out.clipped_high.tolist() == [0.0]


def test_asymmetric_clip_and_masked_tokens_ignored():
    _, out, total = _pl([1.25, 100.0, 0.1], [1.0, 1.0, -3.0], mask=[1.0, 0.0, 0.0], eps_high=0.28)
    assert total.item() == pytest.approx(-1.25)  # 1.25 < 1.28: not clipped; the others are masked


def test_gradients_closed_form():
    # d(-A r)/dlogp = -A r inside the range; 0 where the clipped term is taken
    logp, _, total = _pl([1.5, 1.0, 0.9], [1.0, 1.0, -2.0], grad=True)
    total.backward()
    assert logp.grad.tolist() == pytest.approx([0.0, -1.0, 2.0 * 0.9])


def test_dual_clip_caps_negative_advantage_loss():
    # A = -1, r = 5: max(5, 1.2) = 5 > c = 3 -> L = 3, no gradient; r = 2: 2 < 3 -> L = 2, dL/dlogp = -A r = 2
    logp, out, total = _pl([5.0, 2.0], [-1.0, -1.0], c=3.0, grad=True)
    assert out.loss.tolist() == pytest.approx([3.0, 2.0])
    assert out.dual_clipped.tolist() == [1.0, 0.0]
    total.backward()
    assert logp.grad.tolist() == pytest.approx([0.0, 2.0])
    # positive advantages are never dual clipped: r = 5, A = 1 -> max(-5, -1.2) = -1.2
    _, out, _ = _pl([5.0], [1.0], c=3.0)
    assert out.loss.tolist() == pytest.approx([-1.2]) and out.dual_clipped.sum() == 0


def test_log_ratio_clamped_at_20():
    # logp - old = 50 -> clamped to 20: L = -A e^20 with A = -1, finite, and no gradient through the clamp
    logp = torch.tensor([50.0], dtype=D, requires_grad=True)
    out = policy_loss(
        logp, torch.zeros(1, dtype=D), torch.tensor([-1.0], dtype=D), torch.ones(1, dtype=D), 0.2, 0.2
    )
    assert out.loss.item() == pytest.approx(math.exp(20.0))
    out.loss.sum().backward()
    assert logp.grad.item() == 0.0


def test_gspo_sequence_ratio_value_and_gradient():
    # one sequence, tokens logp (0.1, -0.3), old 0: s = mean = -0.1, every token's ratio e^-0.1
    # (inside 1 +- 0.2), A = 1: L_t = -e^-0.1; seq-mean-token-mean = -e^-0.1.
    # dL/dlogp_t = -e^s * ds/dlogp_t = -e^-0.1 / 2: the gradient of -exp(mean log-ratio).
    logp = torch.tensor([[0.1, -0.3]], dtype=D, requires_grad=True)
    mask = torch.ones(1, 2, dtype=D)
    out = policy_loss(
        logp, torch.zeros(1, 2, dtype=D), torch.ones(1, 1, dtype=D), mask, 0.2, 0.2, sequence_level=True
    )
    total = (out.loss * aggregation_weights(mask, "seq-mean-token-mean", 2, 1, 2)).sum()
    assert total.item() == pytest.approx(-math.exp(-0.1))
    total.backward()
    assert logp.grad.tolist()[0] == pytest.approx([-math.exp(-0.1) / 2] * 2)
    # logp (0.5, 0.5): s = 0.5, e^0.5 = 1.65 > 1.2 with A > 0: clipped, no gradient
    logp = torch.tensor([[0.5, 0.5]], dtype=D, requires_grad=True)
    out = policy_loss(
        logp, torch.zeros(1, 2, dtype=D), torch.ones(1, 1, dtype=D), mask, 0.2, 0.2, sequence_level=True
    )
    assert out.loss.tolist()[0] == pytest.approx([-1.2, -1.2]) and out.clipped_high.sum() == 2
    out.loss.sum().backward()
    assert logp.grad.abs().sum() == 0


def test_kl_estimators():
    logp = torch.tensor([-1.0, -2.0, -0.5], dtype=D)
    ref = torch.tensor([-1.0, -1.0, -1.5], dtype=D)
    # k1 = logp - ref: 0, -1, 1; k2 = (logp - ref)^2 / 2: 0, 0.5, 0.5
    assert kl_penalty(logp, ref, "k1").tolist() == pytest.approx([0.0, -1.0, 1.0])
    assert kl_penalty(logp, ref, "k2").tolist() == pytest.approx([0.0, 0.5, 0.5])
    # k3: d = ref - logp = 0, 1, -1 -> e^d - d - 1 = 0, e - 2, e^-1
    k3 = [0.0, math.e - 2.0, math.exp(-1.0)]
    assert kl_penalty(logp, ref, "k3").tolist() == pytest.approx(k3)
    assert kl_penalty(logp, ref, "low_var_kl").tolist() == pytest.approx(k3)


def test_k3_clamps():
    # d = ref - logp = 15 -> e^15 - 16 is huge -> capped at 10; d = -30 -> clamped to -20 first:
    # e^-20 + 20 - 1 = 19.0... -> capped at 10; d = 2 -> e^2 - 3 = 4.389 untouched
    logp = torch.zeros(3, dtype=D)
    out = kl_penalty(logp, torch.tensor([15.0, -30.0, 2.0], dtype=D), "k3")
    assert out.tolist() == pytest.approx([10.0, 10.0, math.exp(2.0) - 3.0])


def test_tis_weights_truncated_at_cap():
    # exp(old - engine): e^1 = 2.718 -> cap 2; e^-1 = 0.368 kept; equal logprobs -> 1
    w = tis_weights(torch.tensor([-1.0, -2.0, -3.0]), torch.tensor([-2.0, -1.0, -3.0]), cap=2.0)
    assert w.tolist() == pytest.approx([2.0, math.exp(-1.0), 1.0])
    assert not w.requires_grad


LOSS = torch.tensor([[1.0, 2.0, 3.0, 9.0], [4.0, 9.0, 9.0, 9.0]])
MASK = torch.tensor([[1.0, 1.0, 1.0, 0.0], [1.0, 0.0, 0.0, 0.0]])


@pytest.mark.parametrize(
    "mode,expected",
    [
        ("token-mean", (1 + 2 + 3 + 4) / 4),  # 4 tokens
        ("seq-mean-token-mean", ((1 + 2 + 3) / 3 + 4 / 1) / 2),  # per-sequence means, averaged
        ("seq-mean-token-sum", ((1 + 2 + 3) + 4) / 2),  # per-sequence sums, averaged
        ("seq-mean-token-sum-norm", ((1 + 2 + 3) + 4) / (2 * 4)),  # sums / (sequences x max_len 4)
    ],
)
def test_aggregation_modes(mode, expected):
    assert (LOSS * aggregation_weights(MASK, mode, 4, 2, 4)).sum().item() == pytest.approx(expected)
    # split into two micro-batches with the step's global counts: the same number
    split = sum(
        (LOSS[i : i + 1] * aggregation_weights(MASK[i : i + 1], mode, 4, 2, 4)).sum() for i in range(2)
    )
    assert split.item() == pytest.approx(expected)


def test_token_logprobs_matches_manual():
    torch.manual_seed(0)
    logits = torch.randn(2, 3, 5)
    targets = torch.randint(0, 5, (2, 3))
    got = token_logprobs(logits, targets, temperature=0.7)
    for b in range(2):
        for t in range(3):
            z = logits[b, t] / 0.7
            manual = z[targets[b, t]] - torch.logsumexp(z, 0)
            assert got[b, t].item() == pytest.approx(manual.item(), abs=1e-6)


def test_entropy_uniform_is_log_vocab():
    entropy = entropy_from_logits(torch.full((3, 4, 17), 2.5), temperature=0.3)
    assert entropy.shape == (3, 4)
    assert torch.allclose(entropy, torch.full((3, 4), math.log(17)))


def test_entropy_peaked_and_temperature():
    logits = torch.tensor([[0.0, math.log(3.0)]])  # p = (1/4, 3/4)
    expected = -(0.25 * math.log(0.25) + 0.75 * math.log(0.75))
    assert entropy_from_logits(logits).item() == pytest.approx(expected, rel=1e-6)
    assert entropy_from_logits(logits, temperature=10.0).item() > expected
