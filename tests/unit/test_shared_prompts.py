"""A group's responses packed behind one copy of their prompt give every sample the logits,
and the model the gradients, of the one-sample-per-row forward."""

from __future__ import annotations

import random

import pytest
import torch

from infra.config import TinyModelConfig
from infra.model.tiny import build_tiny_model
from infra.rollout.batch import Sample
from infra.trainer.batches import collate, logits_of
from infra.trainer.losses import token_logprobs


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory):
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(1)
    path = build_tiny_model(tmp_path_factory.mktemp("tiny"), TinyModelConfig())
    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)


def _groups(prompt_lens: list[int], copies: int, response_lens: list[int], seed: int = 0) -> list[Sample]:
    """`copies` samples of each prompt, in turn through `response_lens`, interleaved as a
    micro-batch plan may leave them."""
    g = random.Random(seed)
    prompts = [[1] + [g.randrange(4, 90) for _ in range(n - 1)] for n in prompt_lens]
    samples, lengths = [], iter(response_lens * len(prompts) * copies)
    for _ in range(copies):
        for i, prompt in enumerate(prompts):
            response = [g.randrange(4, 90) for _ in range(next(lengths))]
            samples.append(
                Sample(
                    "p", "l", "r", prompt, response, [-1.0] * len(response), 0, i, advantage=g.uniform(-1, 1)
                )
            )
    return samples


def _plain(mb):
    return type(mb)(**{**mb.__dict__, "shared": None})


def test_packed_logits_and_gradients_equal_one_row_per_sample(model):
    samples = _groups([9, 6, 12], copies=6, response_lens=[1, 3, 1, 2])
    mb = collate(samples, list(range(len(samples))), torch.device("cpu"), share_prompts=True)
    assert mb.shared is not None and mb.shared.input_ids.shape[0] == 3  # one row per prompt
    grads = []
    for batch in (mb, _plain(mb)):
        model.zero_grad()
        logits = logits_of(model, batch)
        assert logits.shape == (len(samples), mb.input_ids.shape[1] - 1, model.config.vocab_size)
        assert torch.isfinite(logits).all()  # padding and prompt positions too: 0 x NaN would poison
        logprobs = token_logprobs(logits, batch.input_ids[:, 1:], 1.0)
        (logprobs * batch.mask * batch.advantages).sum().backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
        if batch is mb:
            packed = logprobs.detach()
        else:
            plain = logprobs.detach()
    keep = mb.mask.bool()
    torch.testing.assert_close(packed[keep], plain[keep], atol=1e-5, rtol=1e-5)
    for name, grad in grads[0].items():
        torch.testing.assert_close(grad, grads[1][name], atol=1e-5, rtol=1e-4, msg=name)


def test_packing_only_where_it_cuts_the_padded_tokens_by_a_quarter():
    def packed(samples: list[Sample], share: bool = True):
        return collate(samples, list(range(len(samples))), torch.device("cpu"), share).shared

    assert packed(_groups([8, 8, 8, 8], copies=1, response_lens=[1])) is None  # no prompt repeats
    # 8 x 24 padded tokens unpacked; packed, at best 4 rows of 44 (0.92 of them)
    assert packed(_groups([4], copies=8, response_lens=[20])) is None
    short = _groups([10], copies=8, response_lens=[1])  # 8 x 11 unpacked, one row of 18 packed
    assert packed(short).input_ids.shape == (1, 18)
    assert packed(short, share=False) is None  # algorithm.shared_prompt_forward=false
    # rows of 2, 4, 8 ... responses, whichever computes the least: for 40 and 8 samples of
    # two prompts (48 x 3 unpacked), 6 rows of 8 (60 tokens) against 4 of 16 (72) or 12 of 4 (72)
    uneven = _groups([2], copies=40, response_lens=[1]) + _groups([2], copies=8, response_lens=[1], seed=1)
    assert packed(uneven).input_ids.shape == (6, 10)
