"""GAE and the clipped value loss against values derived by hand."""

import math

import pytest
import torch

from infra.trainer.critic_losses import clipped_value_loss, gae, masked_whiten

D = torch.float64


def _raw_gae(rewards, values, mask, gamma, lam):
    # undo the whitening: recover the raw advantages from the returns (returns = A + V)
    _, returns = gae(rewards, values, mask, gamma, lam)
    return returns - values


def test_gae_one_sequence_by_hand():
    # 3 response tokens, reward 1 on the last; V = (0.5, 0.6, 0.7), gamma 0.9, lam 0.8
    # delta_2 = 1 - 0.7 = 0.3;  delta_1 = 0 + 0.9 x 0.7 - 0.6 = 0.03;  delta_0 = 0.9 x 0.6 - 0.5 = 0.04
    # A_2 = 0.3;  A_1 = 0.03 + 0.72 x 0.3 = 0.246;  A_0 = 0.04 + 0.72 x 0.246 = 0.21712
    rewards = torch.tensor([[0.0, 0.0, 1.0]], dtype=D)
    values = torch.tensor([[0.5, 0.6, 0.7]], dtype=D)
    mask = torch.ones(1, 3, dtype=D)
    raw = _raw_gae(rewards, values, mask, 0.9, 0.8)
    assert raw.tolist()[0] == pytest.approx([0.21712, 0.246, 0.3])


def test_gae_lam_one_gamma_one_is_return_minus_value():
    # gamma = lam = 1: A_t = sum of rewards from t - V_t (Monte Carlo); padding after the end is skipped
    rewards = torch.tensor([[0.0, 2.0, 0.0]], dtype=D)
    values = torch.tensor([[0.5, 1.5, 9.0]], dtype=D)
    mask = torch.tensor([[1.0, 1.0, 0.0]], dtype=D)
    raw = _raw_gae(rewards, values, mask, 1.0, 1.0)
    assert raw[0, :2].tolist() == pytest.approx([2.0 - 0.5, 2.0 - 1.5])


def test_whitened_advantages():
    adv, _ = gae(
        torch.tensor([[0.0, 1.0], [0.0, 0.0]], dtype=D),
        torch.zeros(2, 2, dtype=D),
        torch.ones(2, 2, dtype=D),
        1.0,
        1.0,
    )
    # raw A = (1, 1, 0, 0): mean 0.5, unbiased var (4 x 0.25) / 3 = 1/3 -> +-0.5 sqrt(3)
    assert adv.flatten().tolist() == pytest.approx(
        [0.5 * math.sqrt(3)] * 2 + [-0.5 * math.sqrt(3)] * 2, rel=1e-6
    )
    with pytest.raises(ValueError):
        masked_whiten(torch.ones(1, 2, dtype=D), torch.tensor([[1.0, 0.0]], dtype=D))


def test_clipped_value_loss_and_gradient():
    # token 0: V 1.0, V_old 0.5, R 2: clipped V = 0.7; errors 1.0 vs 1.69 -> the clipped one, no gradient
    # token 1: V 0.6, V_old 0.5, R 0: clipped V = 0.6 (inside); error 0.36, dL/dV = 0.5 x 2 x 0.6 / 2 tokens
    v = torch.tensor([[1.0, 0.6]], dtype=D, requires_grad=True)
    old = torch.tensor([[0.5, 0.5]], dtype=D)
    ret = torch.tensor([[2.0, 0.0]], dtype=D)
    loss, frac = clipped_value_loss(v, old, ret, torch.ones(1, 2, dtype=D), clip=0.2)
    assert loss.item() == pytest.approx(0.5 * (1.69 + 0.36) / 2)
    assert frac.item() == pytest.approx(0.5)
    loss.backward()
    assert v.grad.tolist()[0] == pytest.approx([0.0, 0.3])
