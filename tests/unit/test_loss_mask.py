"""Tokens the environment wrote (loss_mask 0) get no gradient through the real training
step, while the policy's own tokens around them do."""

from __future__ import annotations

import torch

from infra.config import AlgorithmConfig, TinyModelConfig
from infra.model.tiny import build_tiny_model
from infra.rollout.batch import Sample
from infra.trainer.step import train_on_batch

PROMPT = [10, 11, 12]
MASK = [1, 0, 0, 1]  # policy token, two tool-output tokens, policy token


def _samples() -> list[Sample]:
    return [
        Sample(prompt="", label="", response="", prompt_ids=PROMPT, response_ids=[20 + i, 30, 31, 40 + i],
               engine_logprobs=[-3.0, 0.0, 0.0, -3.0], weight_version=0, group=i // 2, reward=float(i % 2),
               advantage=1.0 if i % 2 else -1.0, loss_mask=MASK)
        for i in range(4)
    ]  # fmt: skip


def test_environment_tokens_get_no_gradient(tmp_path) -> None:
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(
        build_tiny_model(tmp_path, TinyModelConfig()), dtype=torch.float32
    )
    grads: list[torch.Tensor] = []

    def keep_grad(_module, _inputs, logits):
        if torch.is_grad_enabled():  # the loss pass, not the old-policy recompute
            logits.register_hook(lambda g: grads.append(g.detach().clone()))

    model.lm_head.register_forward_hook(keep_grad)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0)
    train_on_batch(
        model, optimizer, scheduler, _samples(), rank=0, world_size=1,
        cfg=AlgorithmConfig(micro_batch_size=2), global_batch_size=4, temperature=1.0, max_response_len=4,
    )  # fmt: skip
    assert len(grads) == 2  # two micro-batches of two samples
    p = len(PROMPT)
    for g in grads:  # [2, T, vocab]; logits at position t predict token t + 1
        per_position = g.abs().sum(-1)
        for j, m in enumerate(MASK):
            predicts_token_j = per_position[:, p + j - 1]
            if m:
                assert (predicts_token_j > 0).all(), j
            else:
                assert (predicts_token_j == 0).all(), j
