"""Which verl 0.9.1 setting each of our options equals, checked on fixed float64 tensors.

Every test runs twice: against the transcription of verl's function and against verl's own
function (tests/unit/verl_reference.py; the second is skipped where verl 0.9.1 does not
import). Some responses hold tokens the environment wrote (loss mask 0 inside the response,
as a multi-turn rollout has): verl's response_mask excludes them, and so must we. Mapping:

| ours                                   | verl 0.9.1                                                  |
|----------------------------------------|-------------------------------------------------------------|
| grpo (normalize_advantage_std=true)    | adv_estimator=grpo, norm_adv_by_std_in_grpo=True            |
| grpo (normalize_advantage_std=false)   | adv_estimator=grpo, norm_adv_by_std_in_grpo=False           |
| dr_grpo                                | grpo + norm_adv_by_std_in_grpo=False + loss_agg_mode=seq-mean-token-sum-norm, loss_scale_factor=max_new_tokens |
| rloo                                   | adv_estimator=rloo                                          |
| reinforce_plus_plus                    | adv_estimator=reinforce_plus_plus, gamma=1                  |
| reinforce_plus_plus_baseline           | adv_estimator=reinforce_plus_plus_baseline                  |
| gspo                                   | policy_loss.loss_mode=gspo, loss_agg_mode=seq-mean-token-mean |
| PPO-clip, clip_ratio_c=3 (default)     | policy_loss.loss_mode=vanilla, clip_ratio_c=3.0             |
| metrics pg_clipfrac, pg_clipfrac_lower, ppo_kl | actor/pg_clipfrac, actor/pg_clipfrac_lower, actor/ppo_kl |
| kl_type k1 / k2 / k3 = low_var_kl      | kl_loss_type kl(k1) / mse(k2) / low_var_kl(k3)              |
| kl_in_reward; metric reward_kl_penalty | use_kl_in_reward=True, fixed kl_ctrl; actor/reward_kl_penalty |
| critic.cliprange_value; value_clipfrac | critic.cliprange_value; critic/vf_clipfrac                  |
| loss_agg_mode token-mean, seq-mean-*   | the same loss_agg_mode on one micro-batch                   |
| tis, tis_cap                           | algorithm.rollout_correction.rollout_is=token, rollout_is_threshold |
"""

from __future__ import annotations

import functools

import pytest
import torch

from infra.config import AlgorithmConfig
from infra.rollout.batch import Sample
from infra.rollout.scoring import assign_advantages
from infra.trainer.critic_losses import clipped_value_loss
from infra.trainer.losses import aggregation_weights, kl_penalty, mean_sequence_kl, policy_loss, tis_weights
from tests.unit.verl_reference import Transcribed, own_or_why_not

D = torch.float64
REWARDS = [1.0, 0.0, 0.0, 1.0, 0.5, 3.0, 5.0, 2.5, 1.0, 1.0, 1.0]
GROUPS = [0, 0, 0, 0, 0, 1, 1, 2, 3, 3, 3]  # group 2 is a lone sample, group 3 is flat
# per response token: 0 where the environment wrote it (never the last token: the reward's)
LOSS_MASKS = [
    [1, 1, 1],
    [1],
    [1, 0, 0, 1],
    [1, 1],
    [1, 1],
    [1, 1, 0, 0, 1],
    [1],
    [1, 0, 1],
    [1, 1],
    [1, 1],
    [1, 0, 0, 1],
]
T = max(map(len, LOSS_MASKS))
MASK = torch.tensor([m + [0] * (T - len(m)) for m in LOSS_MASKS], dtype=D)
B = len(LOSS_MASKS)


@functools.cache
def _own():
    return own_or_why_not()


@pytest.fixture(params=["transcribed", "verl"])
def verl(request):
    if request.param == "transcribed":
        return Transcribed
    own, why = _own()
    if own is None:
        pytest.skip(why)
    return own


def _token_rewards() -> torch.Tensor:
    out = torch.zeros_like(MASK)
    for i, m in enumerate(LOSS_MASKS):
        out[i, len(m) - 1] = REWARDS[i]  # verl's outcome reward sits on the last response token
    return out


def _ours(estimator: str, **kw) -> torch.Tensor:
    """The rollout manager's advantages of samples with these loss masks, per loss token."""
    samples = [
        Sample("p", "l", "r", [1], [5] * len(m), [0.0] * len(m), 0, g, reward=r, loss_mask=m)
        for r, g, m in zip(REWARDS, GROUPS, LOSS_MASKS, strict=True)
    ]
    assign_advantages(samples, AlgorithmConfig(advantage_estimator=estimator, **kw))
    return torch.tensor([[s.advantage] for s in samples], dtype=D) * MASK


ADVANTAGES = {
    "grpo": (lambda: _ours("grpo"), lambda v: v.grpo(_token_rewards(), MASK, GROUPS, True)),
    "grpo-no-std": (
        lambda: _ours("grpo", normalize_advantage_std=False),
        lambda v: v.grpo(_token_rewards(), MASK, GROUPS, False),
    ),
    "dr_grpo": (lambda: _ours("dr_grpo"), lambda v: v.grpo(_token_rewards(), MASK, GROUPS, False)),
    "rloo": (lambda: _ours("rloo"), lambda v: v.rloo(_token_rewards(), MASK, GROUPS)),
    "reinforce_plus_plus": (
        lambda: _ours("reinforce_plus_plus"),
        lambda v: v.reinforce_pp(_token_rewards(), MASK),
    ),
    "reinforce_plus_plus_baseline": (
        lambda: _ours("reinforce_plus_plus_baseline"),
        lambda v: v.reinforce_pp_baseline(_token_rewards(), MASK, GROUPS),
    ),
}


@pytest.mark.parametrize("estimator", list(ADVANTAGES))
def test_advantages_equal_verl(verl, estimator):
    ours, theirs = ADVANTAGES[estimator]
    # grpo's lone sample: verl divides by its float32 std 1 plus 1e-6, we by 1 + 1e-6 exactly
    rtol = 1e-7 if estimator == "grpo" else 1e-12
    torch.testing.assert_close(ours(), theirs(verl), rtol=rtol, atol=1e-12)


# --- losses ------------------------------------------------------------------------------


def _tensors(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(B, T, generator=g, dtype=D) * 3
    # log-ratios ~ N(0, 1.5^2): many ratios outside the clip range, some above the dual clip's 3
    logp = old + torch.randn(B, T, generator=g, dtype=D) * 1.5
    adv = torch.randn(B, 1, generator=g, dtype=D).expand(B, T)
    return logp, old, adv


def _ours_agg(loss: torch.Tensor, mode: str) -> torch.Tensor:
    return (loss * aggregation_weights(MASK, mode, MASK.sum().item(), B, T)).sum()


def _token_mean(term: torch.Tensor) -> float:
    return ((term * MASK).sum() / MASK.sum()).item()


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"])
def test_vanilla_ppo_loss_gradient_and_metrics_equal_verl(verl, mode):
    logp, old, adv = _tensors()
    a, b = logp.clone().requires_grad_(), logp.clone().requires_grad_()
    theirs, metrics = verl.vanilla(old, a, adv, MASK, mode, 0.2, 0.28, 3.0)
    ours = policy_loss(b, old, adv, MASK, 0.2, 0.28, 3.0)
    o = _ours_agg(ours.loss, mode)
    torch.testing.assert_close(o, theirs, rtol=1e-12, atol=1e-12)
    theirs.backward()
    o.backward()
    torch.testing.assert_close(b.grad, a.grad, rtol=1e-12, atol=1e-12)
    # the trainer's metrics of the same names are these per-token terms' token means
    assert _token_mean(ours.clipped_high + ours.clipped_low) == pytest.approx(
        metrics["pg_clipfrac"], rel=1e-7
    )
    assert _token_mean(ours.dual_clipped) == pytest.approx(metrics["pg_clipfrac_lower"], rel=1e-7)
    assert _token_mean(ours.ppo_kl) == pytest.approx(metrics["ppo_kl"], rel=1e-7)
    assert metrics["pg_clipfrac"] > 0 and metrics["pg_clipfrac_lower"] > 0  # both clips bite


def test_dr_grpo_aggregation_equals_verl_with_its_length_as_loss_scale_factor(verl):
    # verl 0.9.1: token sums over the global batch's sequences / global_batch_size / loss_scale_factor
    logp, old, adv = _tensors(1)
    loss = policy_loss(logp, old, adv, MASK, 0.2, 0.2).loss
    theirs = verl.agg_loss(loss, MASK, "seq-mean-token-sum-norm", global_batch_size=B, loss_scale_factor=T)
    torch.testing.assert_close(_ours_agg(loss, "seq-mean-token-sum-norm"), theirs, rtol=1e-12, atol=1e-12)


def test_gspo_equals_verl(verl):
    logp, old, adv = _tensors(2)
    logp = old + (logp - old) * 0.01  # GSPO's clip range is tiny: keep some sequences inside it
    a, b = logp.clone().requires_grad_(), logp.clone().requires_grad_()
    theirs, metrics = verl.gspo(old, a, adv, MASK, 3e-4, 4e-4)
    ours = policy_loss(b, old, adv, MASK, 3e-4, 4e-4, 3.0, sequence_level=True)
    o = _ours_agg(ours.loss, "seq-mean-token-mean")
    torch.testing.assert_close(o, theirs, rtol=1e-12, atol=1e-12)
    theirs.backward()
    o.backward()
    torch.testing.assert_close(b.grad, a.grad, rtol=1e-12, atol=1e-12)
    assert _token_mean(ours.ppo_kl) == pytest.approx(metrics["ppo_kl"], rel=1e-7)


@pytest.mark.parametrize(
    "ours,theirs", [("k1", "kl"), ("k2", "mse"), ("k3", "low_var_kl"), ("low_var_kl", "low_var_kl")]
)
def test_kl_types_equal_verl(verl, ours, theirs):
    logp, _, _ = _tensors(3)
    ref = logp + torch.randn(logp.shape, generator=torch.Generator().manual_seed(3), dtype=D) * 4
    expected = verl.kl_penalty(logp, ref, theirs)
    if theirs == "low_var_kl":
        assert (expected == 10).any()  # wide enough that the +-10 cap bites
    torch.testing.assert_close(kl_penalty(logp, ref, ours), expected, rtol=0, atol=0)


def test_kl_in_reward_and_its_metric_equal_verl(verl):
    logp, _, _ = _tensors(5)
    ref = logp + torch.randn(logp.shape, generator=torch.Generator().manual_seed(5), dtype=D) * 0.5
    rewards, metrics = verl.apply_kl_penalty(MASK, _token_rewards(), logp, ref, 0.5, "low_var_kl")
    seq_kl = (kl_penalty(logp, ref, "k3") * MASK).sum(-1)
    ours = torch.tensor(REWARDS, dtype=D) - 0.5 * seq_kl  # advantage_stage: reward - kl_coef x summed KL
    torch.testing.assert_close(ours, rewards.sum(-1), rtol=1e-12, atol=1e-12)
    assert mean_sequence_kl(seq_kl, MASK.sum(-1)) == pytest.approx(metrics["reward_kl_penalty"], rel=1e-12)
    assert metrics["reward_kl_penalty_coeff"] == 0.5


def test_clipped_value_loss_and_clipfrac_equal_verl_in_float32(verl):
    # float32, values and old values drawn apart: V_old + (V - V_old) often misses V by an ulp,
    # which must not count a value inside the clip range as clipped
    g = torch.Generator().manual_seed(6)
    old, vpreds, returns = (torch.randn(64, 256, generator=g) * 0.3 for _ in range(3))
    mask = (torch.rand(64, 256, generator=g) > 0.1).float()
    loss, frac = clipped_value_loss(vpreds, old, returns, mask, 0.5)
    theirs, their_frac = verl.value_loss(vpreds, returns, old, mask, 0.5)
    assert frac.item() == their_frac.item()
    torch.testing.assert_close(loss, theirs, rtol=1e-6, atol=0)
    assert 0 < frac < 1


def test_tis_equals_verl_token_level_rollout_correction(verl):
    logp, old, adv = _tensors(4)
    engine = old + torch.randn(old.shape, generator=torch.Generator().manual_seed(4), dtype=D) * 0.7
    theirs = verl.token_is_weights(old - engine, MASK, 2.0)
    torch.testing.assert_close(tis_weights(old, engine, 2.0) * MASK, theirs, rtol=1e-12, atol=1e-12)
    assert (theirs == 2.0).any() and ((theirs < 2.0) & (MASK > 0)).any()
