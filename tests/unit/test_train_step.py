"""train_on_batch in one process on the tiny model: the non-finite guard, TIS, staleness,
ppo_epochs, KL in the reward, the old logprobs of a one-step batch taken from the step's
own forward, and the refusal to checkpoint a non-finite state."""

from __future__ import annotations

import math
import random

import pytest
import torch

from infra.config import AlgorithmConfig, TinyModelConfig
from infra.model.tiny import build_tiny_model
from infra.rollout.batch import Sample
from infra.trainer.losses import token_logprobs
from infra.trainer.nonfinite import NonFiniteStateError, assert_finite_state
from infra.trainer.step import train_on_batch


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("tiny"), TinyModelConfig())


def _model(model_dir):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)


def _samples(n=8, version=0, seed=0) -> list[Sample]:
    g = random.Random(seed)
    out = []
    for i in range(n):
        response = [g.randrange(4, 60) for _ in range(g.randint(1, 4))]
        out.append(
            Sample(prompt="", label="", response="", prompt_ids=[g.randrange(4, 60) for _ in range(3)],
                   response_ids=response, engine_logprobs=[-4.0] * len(response), weight_version=version,
                   group=i // 4, reward=float(i % 2), advantage=1.0 if i % 2 else -1.0)
        )  # fmt: skip
    return out


def _train(model, samples, ref=None, gbs=4, **kw):
    """micro-batches of 2 samples; `gbs` 4 (the default): two optimizer steps on 8 samples"""
    opts = {k: kw.pop(k) for k in ("tis", "rollout_id", "old_pass") if k in kw}
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0)
    cfg = AlgorithmConfig(micro_batch_size=2, **kw)
    return train_on_batch(
        model, optimizer, scheduler, samples, rank=0, world_size=1, cfg=cfg, global_batch_size=gbs,
        temperature=1.0, ref_model=ref, max_response_len=4, **opts,
    )  # fmt: skip


def _count_forwards(model) -> list:
    calls: list = []
    model.register_forward_hook(lambda *_: calls.append(1))
    return calls


def _params(model):
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def test_nan_loss_skips_only_its_step(model_dir):
    model = _model(model_dir)
    samples = _samples()
    samples[1].advantage = math.nan  # poisons the first optimizer step (samples 0..3)
    before = _params(model)
    metrics = _train(model, samples)
    assert metrics["skipped_steps"] == 1 and metrics["num_steps"] == 2
    assert all(torch.isfinite(p).all() for p in model.parameters())
    # the second step still trained: the skipped one left no stale gradient behind
    assert any(not torch.equal(before[n], p) for n, p in _params(model).items())
    only_second = _model(model_dir)
    _train(only_second, samples[4:])
    for n, p in _params(only_second).items():
        torch.testing.assert_close(p, _params(model)[n], rtol=0, atol=1e-6)


def test_all_steps_non_finite_leave_weights_untouched(model_dir):
    model = _model(model_dir)
    samples = _samples()
    for s in samples:
        s.advantage = math.inf
    before = _params(model)
    metrics = _train(model, samples)
    assert metrics["skipped_steps"] == 2
    assert all(torch.equal(before[n], p) for n, p in _params(model).items())


def test_non_finite_state_is_never_checkpointed(model_dir):
    model = _model(model_dir)
    assert_finite_state(model, None, world_size=1)  # finite: no error
    with torch.no_grad():
        next(model.parameters())[0, 0] = math.nan
    with pytest.raises(NonFiniteStateError, match="refusing to checkpoint"):
        assert_finite_state(model, None, world_size=1)


def test_tis_staleness_and_mismatch_split(model_dir):
    model = _model(model_dir)
    # half the samples come from the trainer's own weights (version 3), half are one step stale
    samples = _samples(version=3)
    for s in samples[4:]:
        s.weight_version = 2
    for s in samples[:2]:  # the engine found these tokens far less likely: weights e^6, capped
        s.engine_logprobs = [-10.0] * len(s.response_ids)
    m = _train(model, samples, tis=True, rollout_id=3, tis_cap=1.5)
    assert m["staleness_mean"] == 0.5 and m["staleness_max"] == 1
    tokens = sum(len(s.response_ids) for s in samples)
    assert m["train_engine_logprob_tokens"] + m["train_engine_logprob_tokens_stale"] == tokens
    assert m["train_engine_logprob_tokens"] == sum(len(s.response_ids) for s in samples[:4])
    assert m["tis_weight_max"] == pytest.approx(1.5) and 0 < m["tis_weight_mean"] < 1.5
    assert m["tis_capped_frac"] >= sum(len(s.response_ids) for s in samples[:2]) / tokens


def test_tis_without_engine_logprobs_is_refused(model_dir):
    samples = _samples()
    samples[2].engine_logprobs = []
    with pytest.raises(ValueError, match="algorithm.tis"):
        _train(_model(model_dir), samples, tis=True)


def test_ppo_epochs_repeat_the_steps(model_dir):
    m = _train(_model(model_dir), _samples(), ppo_epochs=3)
    assert m["num_steps"] == 6 and m["skipped_steps"] == 0
    assert m["response_tokens"] == sum(len(s.response_ids) for s in _samples())


def test_kl_in_reward_penalises_the_reward(model_dir):
    model, ref = _model(model_dir), _model(model_dir)
    with torch.no_grad():
        for p in ref.parameters():
            p.add_(0.05 * torch.randn_like(p))
    samples = _samples()
    long = next(s for s in samples if len(s.response_ids) >= 3)
    long.loss_mask = [1, 0] + [1] * (len(long.response_ids) - 2)  # a token the environment wrote
    # verl's reward_kl_penalty: per sequence the mean k1 (old logp - ref) over its loss tokens,
    # averaged over the sequences; the old policy is the model before its first step
    per_seq = []
    for s in samples:
        kl = _response_logprobs(model, s) - _response_logprobs(ref, s)
        keep = torch.tensor(s.loss_mask if s.loss_mask is not None else [1] * len(s.response_ids))
        per_seq.append(float((kl * keep).sum() / keep.sum()))
    m = _train(model, samples, ref=ref, kl_coef=0.5, kl_in_reward=True, kl_type="k1")
    assert m["reward_kl_penalty"] == pytest.approx(sum(per_seq) / len(per_seq), rel=1e-4, abs=1e-6)
    assert m["reward_kl_penalty"] != 0 and m["reward_kl_penalty_coeff"] == 0.5
    assert math.isfinite(m["loss"])  # the loss has no KL term; the "kl" metric is still measured


def _response_logprobs(model, s: Sample) -> torch.Tensor:
    ids = torch.tensor([s.prompt_ids + s.response_ids])
    with torch.no_grad():
        logp = token_logprobs(model(input_ids=ids).logits[:, :-1], ids[:, 1:], 1.0)[0]
    return logp[len(s.prompt_ids) - 1 :]


def test_a_one_step_batch_has_no_old_policy_pass(model_dir):
    one_step, two_steps = _model(model_dir), _model(model_dir)
    forwards_one, forwards_two = _count_forwards(one_step), _count_forwards(two_steps)
    _train(one_step, _samples(), gbs=8)  # 4 micro-batches, one optimizer step
    _train(two_steps, _samples(), gbs=4)  # the same 4, two steps
    # one step: each micro-batch's loss forward also gives its old logprobs; two steps: the
    # second step's weights are not the old policy's, so a pass of their own runs first
    assert len(forwards_one) == 4
    assert len(forwards_two) == 8


def test_ppo_kl_and_the_clip_fractions_under_verls_names(model_dir):
    one = _train(_model(model_dir), _samples(), gbs=8)
    two = _train(_model(model_dir), _samples(), gbs=4)
    # ppo_kl: mean old logp - logp; 0 in a step on the old policy's own weights, not after a step
    assert one["ppo_kl"] == 0.0 and two["ppo_kl"] != 0.0
    for m in (one, two):
        assert {"pg_clipfrac", "pg_clipfrac_high", "pg_clipfrac_lower", "ppo_kl"} <= set(m)
        assert not {"pg_clipfrac_low", "pg_clipfrac_dual"} & set(m)
        assert 0 <= m["pg_clipfrac_lower"] <= 1 and m["pg_clipfrac_high"] <= m["pg_clipfrac"]


def test_old_logprobs_from_the_step_train_as_a_pass_of_their_own(model_dir):
    """Same weights after the step and the same metrics as with the old-policy pass, with
    everything that reads the old logprobs on: TIS (some weights capped), fresh and stale
    samples, and a KL loss against a reference model."""
    samples = _samples(version=3)
    for s in samples[4:]:
        s.weight_version = 2
    for s in samples[:2]:
        s.engine_logprobs = [-10.0] * len(s.response_ids)
    ref = _model(model_dir)
    with torch.no_grad():
        for p in ref.parameters():
            p.add_(0.05 * torch.randn_like(p))
    opts = {"gbs": 8, "tis": True, "rollout_id": 3, "tis_cap": 1.5, "kl_coef": 0.5, "entropy_coef": 0.01}
    from_step = _model(model_dir)
    forwards = _count_forwards(from_step)
    m_step = _train(from_step, samples, ref=ref, **opts)
    assert len(forwards) == 4
    with_pass = _model(model_dir)
    forwards = _count_forwards(with_pass)
    m_pass = _train(with_pass, samples, ref=ref, old_pass=True, **opts)
    assert len(forwards) == 8
    assert m_step.keys() == m_pass.keys()
    assert m_step["tis_capped_frac"] > 0 and m_step["train_engine_logprob_tokens_stale"] > 0
    for key, value in m_pass.items():
        assert m_step[key] == pytest.approx(value, rel=1e-5, abs=1e-6), key
    after = _params(with_pass)
    for name, p in _params(from_step).items():
        torch.testing.assert_close(p, after[name], rtol=0, atol=1e-6)
