"""PPO's per-token targets: token rewards (with the KL in the reward), GAE over a rollout, the
critic's value alignment with the actor's token positions, and the actor using them."""

from __future__ import annotations

import random

import pytest
import torch

from infra.config import AlgorithmConfig, RunConfig, TinyModelConfig
from infra.model.tiny import build_tiny_model
from infra.rollout.batch import Sample
from infra.trainer.batches import collate
from infra.trainer.critic_step import compute_values, train_critic_on_batch
from infra.trainer.losses import token_logprobs
from infra.trainer.ppo_targets import (
    as_lists,
    from_lists,
    ppo_targets,
    response_mask,
    to_positions,
    token_rewards,
)
from infra.trainer.step import train_on_batch


def _sample(prompt: list[int], response: list[int], reward: float, loss_mask=None) -> Sample:
    return Sample(
        prompt="", label="", response="", prompt_ids=prompt, response_ids=response,
        engine_logprobs=[-1.0] * len(response), weight_version=0, group=0, reward=reward,
        loss_mask=loss_mask,
    )  # fmt: skip


def test_token_rewards_sit_on_the_last_loss_token_minus_the_kl():
    samples = [
        _sample([5, 6], [7, 8, 9], 1.0),
        _sample([5], [7, 8, 9, 10], 2.0, loss_mask=[1, 1, 0, 0]),  # env tokens last: reward at j=1
        _sample([5], [], 3.0),  # no response: no token, no reward
    ]
    mask = response_mask(samples)
    assert mask.tolist() == [[1, 1, 1, 0], [1, 1, 0, 0], [0, 0, 0, 0]]
    assert token_rewards(samples, mask).tolist() == [[0, 0, 1, 0], [0, 2, 0, 0], [0, 0, 0, 0]]
    kl = torch.tensor([[0.5, 0.25, 1.0, 9.0], [1.0, 2.0, 9.0, 9.0], [9.0] * 4])
    got = token_rewards(samples, mask, kl, kl_coef=0.1)
    want = torch.tensor([[-0.05, -0.025, 0.9, 0], [-0.1, 1.8, 0, 0], [0, 0, 0, 0]])
    assert torch.allclose(got, want)


def test_gae_returns_with_kl_in_reward_by_hand():
    # gamma = lam = 1: the return of token t is the reward minus the KL penalties from t on,
    # and the advantage before whitening is that return minus the value
    samples = [_sample([1], [2, 3, 4], 1.0), _sample([1], [2, 3], 0.0)]
    values = torch.tensor([[0.2, 0.4, 0.6], [0.1, -0.3, 0.0]])
    kl = torch.tensor([[0.1, 0.2, 0.3], [0.5, 0.5, 0.0]])
    adv, ret = ppo_targets(samples, values, gamma=1.0, lam=1.0, kl=kl, kl_coef=1.0)
    want_ret = torch.tensor([[1 - 0.6, 1 - 0.5, 1 - 0.3], [-1.0, -0.5, 0.0]])
    assert torch.allclose(ret, want_ret)
    raw = (want_ret - values)[:, :3] * response_mask(samples)
    mask = response_mask(samples)
    mean = raw.sum() / mask.sum()
    std = (((raw - mean) ** 2 * mask).sum() / (mask.sum() - 1)).sqrt()
    assert torch.allclose(adv, (raw - mean) / std * mask, atol=1e-6)
    # whitened over the rollout's response tokens: mean 0 there, 0 elsewhere
    assert abs(float(adv.sum())) < 1e-5 and adv[1, 2] == 0


def test_gae_discounts_with_gamma_and_lambda():
    samples = [_sample([1], [2, 3], 1.0), _sample([1], [2, 3], 0.0)]
    values = torch.tensor([[0.5, 0.25], [0.0, 0.0]])
    _, ret = ppo_targets(samples, values, gamma=0.5, lam=0.5)
    # last token: delta = 1 - 0.25; first: delta = 0 + 0.5 * 0.25 - 0.5, A = delta + 0.25 * A_last
    a1 = 0.75
    a0 = (0.125 - 0.5) + 0.25 * a1
    assert torch.allclose(ret[0], torch.tensor([a0 + 0.5, a1 + 0.25]))


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("tiny"), TinyModelConfig())


def _critic(model_dir):
    from infra.trainer.critic_rank import load_value_model

    torch.manual_seed(0)
    return load_value_model(str(model_dir)).train()  # train mode as on the ranks: no dropout left


def _cfg(**algorithm) -> RunConfig:
    return RunConfig.model_validate(
        {
            "rollout": {
                "prompts_per_rollout": 2,
                "n_samples_per_prompt": 2,
                "sampling": {"max_new_tokens": 4},
            },
            "algorithm": {"advantage_estimator": "ppo", "micro_batch_size": 2, **algorithm},
            "critic": {"enabled": True},
        }
    )


def _samples(seed=0):
    g = random.Random(seed)
    return [
        _sample([g.randrange(4, 60) for _ in range(g.randint(2, 5))],
                [g.randrange(4, 60) for _ in range(g.randint(1, 4))], float(i % 2))
        for i in range(4)
    ]  # fmt: skip


def test_value_of_a_token_is_read_where_the_actor_reads_its_logprob(model_dir):
    critic, samples = _critic(model_dir), _samples()
    values = compute_values(critic, samples, _cfg(), rank=0, world_size=1)
    # train mode, as on the ranks: the head's dropout is off, so a value is a function of the tokens
    assert torch.equal(values, compute_values(critic, samples, _cfg(), rank=0, world_size=1))
    for i, s in enumerate(samples):
        p, r = len(s.prompt_ids), len(s.response_ids)
        alone = critic(input_ids=torch.tensor([s.prompt_ids + s.response_ids])).logits[0, :, 0]
        # the value of response token j: the head at position p + j - 1 (it sees tokens < j only)
        assert torch.allclose(values[i, :r], alone[p - 1 : p + r - 1], atol=1e-5)
        changed = list(s.response_ids)
        changed[-1] = 3 if changed[-1] != 3 else 4
        other = critic(input_ids=torch.tensor([s.prompt_ids + changed])).logits[0, :, 0]
        assert torch.allclose(other[p - 1 : p + r - 1], alone[p - 1 : p + r - 1], atol=1e-6)
    # in a micro-batch the values land exactly on the actor's logprob positions
    mb = collate(samples, range(len(samples)), torch.device("cpu"))
    at = to_positions(values, mb, samples)
    targets = mb.input_ids[:, 1:]
    for row, s in enumerate(samples):
        p, r = len(s.prompt_ids), len(s.response_ids)
        assert targets[row, p - 1 : p + r - 1].tolist() == s.response_ids
        assert torch.equal(at[row, p - 1 : p + r - 1], values[row, :r])
        assert (at[row] != 0).sum() <= r and mb.mask[row].sum() == r
    assert torch.equal(from_lists(as_lists(values, samples), samples), values)


def test_critic_step_fits_the_returns(model_dir):
    cfg = _cfg()
    critic, samples = _critic(model_dir), _samples(1)
    optimizer = torch.optim.AdamW(critic.parameters(), lr=1e-2)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0)
    losses = []
    for _ in range(8):
        values = compute_values(critic, samples, cfg, 0, 1)
        _, returns = ppo_targets(samples, values, 1.0, 1.0)
        m = train_critic_on_batch(
            critic, optimizer, scheduler, samples, values, returns, cfg=cfg, rank=0, world_size=1
        )
        losses.append(m["value_loss"])
    assert losses[-1] < 0.5 * losses[0], losses
    assert m["critic_num_steps"] == 1 and 0 <= m["value_clipfrac"] <= 1 and m["value_explained_var"] > 0


def test_actor_trains_on_per_token_advantages_and_publishes_its_kl(model_dir):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    actor = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    ref = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    with torch.no_grad():
        for p in actor.parameters():
            p.add_(0.01 * torch.randn_like(p))  # the actor has moved away from the reference
    samples = _samples(2)
    values = [[0.1 * (j + 1) for j in range(len(s.response_ids))] for s in samples]
    got: list = []
    cfg = AlgorithmConfig(
        advantage_estimator="ppo", micro_batch_size=2, kl_coef=0.5, kl_in_reward=True, kl_type="k1"
    )
    optimizer = torch.optim.SGD(actor.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0)
    mb = collate(samples, range(len(samples)), torch.device("cpu"))
    with torch.no_grad():
        kl = token_logprobs(
            actor(input_ids=mb.input_ids).logits[:, :-1], mb.input_ids[:, 1:], 1.0
        ) - token_logprobs(ref(input_ids=mb.input_ids).logits[:, :-1], mb.input_ids[:, 1:], 1.0)
    m = train_on_batch(
        actor, optimizer, scheduler, samples, rank=0, world_size=1, cfg=cfg, global_batch_size=4,
        temperature=1.0, ref_model=ref, values=values, publish_kl=got.append,
    )  # fmt: skip
    assert len(got) == 1 and [len(k) for k in got[0]] == [len(s.response_ids) for s in samples]
    # the published KL is k1 of the actor before its step against the reference, per token
    for row, s in enumerate(samples):
        p, r = len(s.prompt_ids), len(s.response_ids)
        assert torch.allclose(torch.tensor(got[0][row]), kl[row, p - 1 : p + r - 1], atol=1e-5)
    # the loss of the first step is the mean of whitened advantages (the ratio is 1): zero up
    # to rounding, so what shows that it trained is its gradient
    assert m["reward_kl_penalty"] != 0 and m["num_steps"] == 1 and m["grad_norm"] > 0
    with pytest.raises(ValueError, match="no values from the critic"):
        train_on_batch(
            actor, optimizer, scheduler, samples, rank=0, world_size=1, cfg=cfg, global_batch_size=4,
            temperature=1.0, ref_model=ref,
        )  # fmt: skip


def test_the_manager_leaves_ppo_samples_without_a_scalar_advantage():
    from infra.rollout.scoring import assign_advantages

    samples = [_sample([1], [2], 1.0), _sample([1], [2], 0.0)]
    assign_advantages(samples, _cfg().algorithm)  # per-token GAE comes later, on the trainer
    assert [s.advantage for s in samples] == [0.0, 0.0]
