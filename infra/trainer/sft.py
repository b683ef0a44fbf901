"""Supervised fine-tuning: cross-entropy on the answer tokens only, the prompt as context.

An epoch takes the examples in its own shuffled order (a pure function of sft.seed and the
epoch, so every rank computes the same one) and cuts it into optimizer steps of
sft.batch_size examples; the rows left over go unused in that epoch. Each rank trains on
its share of a step in micro-batches of sft.micro_batch_size, collated as rollout samples
are (`collate`: only response positions are in the mask). A step's loss is the mean
cross-entropy over all its answer tokens on all ranks, whatever the split, so 2 ranks take
the same step as one process does.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from infra.config import SFTConfig
from infra.data.labelled import Example
from infra.rollout.batch import Sample
from infra.trainer.batches import MicroBatch, all_reduce_sum, collate, logits_of
from infra.trainer.losses import token_logprobs
from infra.trainer.micro_batches import plan_by_count
from infra.trainer.optimizer_step import OptimizerSteps
from infra.trainer.parallelize import MicroBatches, micro_batches


def steps_per_epoch(num_examples: int, batch_size: int) -> int:
    return num_examples // batch_size


def epoch_order(num_examples: int, epoch: int, seed: int) -> list[int]:
    return np.random.default_rng([seed, epoch]).permutation(num_examples).tolist()


def as_samples(examples: list[Example]) -> list[Sample]:
    """Examples in the shape `collate` takes: the answer is the response."""
    return [
        Sample("", "", "", e.prompt_ids, e.answer_ids, engine_logprobs=[], weight_version=0, group=i)
        for i, e in enumerate(examples)
    ]


class AnswerLoss:
    """The steps' forwards and backwards, and the epoch's sums of what they saw: answer
    tokens, those the model ranks first, and answers it ranks first whole (greedy decoding
    would write them)."""

    def __init__(self, world_size: int, device: torch.device) -> None:
        self.world_size = world_size
        self.sums = torch.zeros(4, device=device)  # answer tokens, top-1 tokens, answers, top-1 answers

    def backward(self, model: nn.Module, step: list[MicroBatch], fsdp: MicroBatches) -> torch.Tensor:
        """Forward and backward of one step's micro-batches on this rank; the step's loss."""
        local = torch.stack([mb.mask.sum() for mb in step]).sum().reshape(1)
        tokens = max(float(all_reduce_sum(local, self.world_size)), 1.0)
        step_loss = torch.zeros((), device=self.sums.device)
        for i, mb in enumerate(step):
            logits = logits_of(model, mb)
            targets = mb.input_ids[:, 1:]
            loss = -(token_logprobs(logits, targets, 1.0) * mb.mask).sum() / tokens
            fsdp.before_backward(last=i == len(step) - 1)
            # x world_size undoes FSDP's averaging of gradients over ranks
            (loss * self.world_size).backward()
            step_loss += loss.detach()
            top1 = (logits.detach().argmax(-1) == targets).float() * mb.mask
            whole = (top1.sum(-1) == mb.mask.sum(-1)).float()
            self.sums += torch.stack([mb.mask.sum(), top1.sum(), whole.new_tensor(len(whole)), whole.sum()])
        return all_reduce_sum(step_loss, self.world_size)

    def metrics(self) -> dict:
        tokens, top1, answers, whole = all_reduce_sum(self.sums.clone(), self.world_size).tolist()
        return {
            "answer_tokens": int(tokens),
            "token_accuracy": top1 / max(tokens, 1.0),
            "answer_accuracy": whole / max(answers, 1.0),
        }


def train_sft_epoch(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    examples: list[Example],
    epoch: int,
    *,
    rank: int,
    world_size: int,
    cfg: SFTConfig,
) -> dict:
    """One epoch of SFT steps; every rank gets the same `examples` and returns the same metrics."""
    batch = cfg.batch_size
    if batch % world_size or steps_per_epoch(len(examples), batch) == 0:
        raise ValueError(
            f"{len(examples)} labelled examples must fill at least one step of sft.batch_size={batch}, "
            f"itself divisible by world_size={world_size}"
        )
    device = next(model.parameters()).device
    samples = as_samples(examples)
    order = epoch_order(len(examples), epoch, cfg.seed)
    mine = plan_by_count(batch, world_size, batch, cfg.micro_batch_size)[0][rank]  # positions in a step
    loss = AnswerLoss(world_size, device)
    steps = OptimizerSteps(model, optimizer, scheduler, cfg.grad_clip, world_size)
    with micro_batches(model) as fsdp:
        for first in range(0, steps_per_epoch(len(examples), batch) * batch, batch):
            chosen = order[first : first + batch]
            step = [collate([samples[chosen[i]] for i in mb], [chosen[i] for i in mb], device) for mb in mine]
            steps.take(loss.backward(model, step, fsdp))
    return {**loss.metrics(), **steps.metrics()}
