"""A micro-batch's padded layout: where the loss, the engine's logprobs and padding go."""

from __future__ import annotations

import torch

from infra.rollout.batch import Sample
from infra.trainer.batches import collate


def _sample(prompt, response, logprobs, loss_mask=None, advantage=0.0) -> Sample:
    return Sample("p", "l", "r", prompt, response, logprobs, 0, 0, advantage=advantage, loss_mask=loss_mask)


def test_layout_of_loss_engine_logprobs_and_padding():
    samples = [
        _sample([1, 2, 3], [4, 5], [-1.0, -2.0], loss_mask=[1, 0], advantage=0.5),  # 2nd token: tool output
        _sample([], [7], [-3.0]),  # no context: nothing to learn
        _sample([9], [8, 6], [-4.0]),  # engine logprobs incomplete: in the loss, no logprob gap
    ]
    mb = collate(samples, [5, 6, 7], torch.device("cpu"))
    assert mb.input_ids.tolist() == [[1, 2, 3, 4, 5], [7, 0, 0, 0, 0], [9, 8, 6, 0, 0]]
    assert mb.mask.tolist() == [[0, 0, 1, 0], [0, 0, 0, 0], [1, 1, 0, 0]]
    assert mb.engine_logprobs.tolist() == [[0, 0, -1, -2], [0, 0, 0, 0], [0, 0, 0, 0]]
    assert mb.engine_mask.tolist() == [[0, 0, 1, 0], [0, 0, 0, 0], [0, 0, 0, 0]]
    assert mb.advantages.tolist() == [[0.5], [0.0], [0.0]] and mb.index == [5, 6, 7]
    assert mb.input_ids.dtype == torch.long and mb.mask.dtype == mb.engine_logprobs.dtype == torch.float32


def test_rows_are_at_least_two_tokens():
    mb = collate([_sample([1], [], [])], [0], torch.device("cpu"))
    assert mb.input_ids.tolist() == [[1, 0]] and mb.mask.tolist() == [[0]]
