import math

import pytest
import torch

from infra.trainer.losses import entropy_from_logits, kl_k3, ppo_clip_loss, token_logprobs


def _loss(ratios, advantages, mask, eps_low=0.2, eps_high=0.2):
    old = torch.zeros(len(ratios), dtype=torch.float64)
    logp = torch.log(torch.tensor(ratios, dtype=torch.float64))
    return ppo_clip_loss(
        logp, old, torch.tensor(advantages, dtype=torch.float64), torch.tensor(mask), eps_low, eps_high
    )


def test_ratio_inside_clip_range_is_plain_surrogate():
    loss, clipped = _loss([1.1, 0.9], [2.0, -1.0], [1.0, 1.0])
    assert loss.item() == pytest.approx(-2.0 * 1.1 + 1.0 * 0.9)
    assert clipped.item() == 0


def test_positive_advantage_clipped_above():
    # r = 1.5 > 1 + eps: the objective stops growing, loss = -A * 1.2 and the token counts as clipped
    loss, clipped = _loss([1.5], [2.0], [1.0])
    assert loss.item() == pytest.approx(-2.4)
    assert clipped.item() == 1
    # r = 0.5 < 1 - eps with A > 0: the unclipped (pessimistic) term wins, no clipping
    loss, clipped = _loss([0.5], [2.0], [1.0])
    assert loss.item() == pytest.approx(-1.0)
    assert clipped.item() == 0


def test_negative_advantage_clipped_below():
    loss, clipped = _loss([0.5], [-1.0], [1.0])
    assert loss.item() == pytest.approx(0.8)  # -(-1) * clip(0.5) = 0.8
    assert clipped.item() == 1
    loss, clipped = _loss([1.5], [-1.0], [1.0])
    assert loss.item() == pytest.approx(1.5)
    assert clipped.item() == 0


def test_asymmetric_clip_and_masked_tokens_ignored():
    loss, clipped = _loss([1.25, 100.0, 0.1], [1.0, 1.0, -3.0], [1.0, 0.0, 0.0], eps_low=0.2, eps_high=0.28)
    assert loss.item() == pytest.approx(-1.25)  # 1.25 < 1.28: not clipped; the others are masked
    assert clipped.item() == 0


def test_clipped_tokens_have_no_gradient():
    logp = torch.log(torch.tensor([1.5, 1.0])).requires_grad_()
    loss, _ = ppo_clip_loss(logp, torch.zeros(2), torch.tensor([1.0, 1.0]), torch.ones(2), 0.2, 0.2)
    loss.backward()
    assert logp.grad.tolist() == pytest.approx([0.0, -1.0])


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


def test_kl_k3_values():
    logp = torch.tensor([-1.0, -2.0, -0.5, -3.0])
    ref = torch.tensor([-1.0, -1.0, -1.5, 0.0])
    mask = torch.tensor([1.0, 1.0, 1.0, 0.0])
    expected = 0.0 + (math.e - 1.0 - 1.0) + (math.exp(-1.0) + 1.0 - 1.0)
    assert kl_k3(logp, ref, mask).item() == pytest.approx(expected, rel=1e-6)


def test_entropy_uniform_is_log_vocab():
    entropy = entropy_from_logits(torch.full((3, 4, 17), 2.5), temperature=0.3)
    assert entropy.shape == (3, 4)
    assert torch.allclose(entropy, torch.full((3, 4), math.log(17)))


def test_entropy_peaked_and_temperature():
    logits = torch.tensor([[0.0, math.log(3.0)]])  # p = (1/4, 3/4)
    expected = -(0.25 * math.log(0.25) + 0.75 * math.log(0.75))
    assert entropy_from_logits(logits).item() == pytest.approx(expected, rel=1e-6)
    # a higher temperature flattens the distribution
    assert entropy_from_logits(logits, temperature=10.0).item() > expected
