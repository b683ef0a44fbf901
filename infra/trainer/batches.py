"""Samples -> the plan of padded micro-batches of every optimizer step, and the small
collectives the step needs."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from infra.config import AlgorithmConfig
from infra.rollout.batch import Sample
from infra.trainer.micro_batches import padded_length, plan_by_count, plan_by_tokens
from infra.trainer.shared_prompts import SharedPrompts, pack_shared, shared_logits


@dataclass
class MicroBatch:
    input_ids: torch.Tensor  # [B, T] prompt + response, right-padded
    mask: torch.Tensor  # [B, T-1] 1 where the next token is a response token
    advantages: torch.Tensor  # [B, 1]
    engine_logprobs: torch.Tensor  # [B, T-1], aligned with mask
    engine_mask: torch.Tensor  # [B, T-1], mask of samples whose engine logprobs are complete
    index: list[int]  # position of each row in the rollout's sample list
    old_logprobs: torch.Tensor | None = None
    ref_logprobs: torch.Tensor | None = None
    tis_weights: torch.Tensor | None = None  # [B, T-1], truncated importance weights
    shared: SharedPrompts | None = None  # the forward's packed layout, where prompts repeat


def collate(
    samples: list[Sample], index: list[int], device: torch.device, share_prompts: bool = False
) -> MicroBatch:
    """`index`: each sample's position in the rollout's sample list. `share_prompts`: a
    prompt's samples may share its forward (`shared_prompts`)."""
    # Pad id 0 is arbitrary: right padding under a causal mask never influences real tokens
    # and padded positions are masked out of every loss and metric. Length >= 2 so that a
    # micro-batch of empty responses still yields one (masked) target position.
    length = max(2, *(len(s.prompt_ids) + len(s.response_ids) for s in samples))
    width = length - 1
    none = [0.0] * width
    ids, mask, engine, engine_mask = [], [], [], []
    # rows built as lists and turned into tensors once: a tensor op per sample was a fifth
    # of a trainer rank's step at the demo's shape (512 samples a rank, py-spy)
    for s in samples:
        p, r = len(s.prompt_ids), len(s.response_ids)
        ids.append(s.prompt_ids + s.response_ids + [0] * (length - p - r))
        if r == 0 or p == 0:  # nothing to learn from (no response, or no context to predict it)
            mask.append(none)
            engine.append(none)
            engine_mask.append(none)
            continue
        # logits at position t predict token t + 1: response token j is predicted at p + j - 1
        # tokens the environment wrote (loss_mask 0) are context only: no loss, no logprob gap
        before, after = [0.0] * (p - 1), [0.0] * (length - p - r)
        keep = [float(k) for k in s.loss_mask] if s.loss_mask is not None else [1.0] * r
        mask.append(before + keep + after)
        complete = len(s.engine_logprobs) == r
        engine.append(before + [float(x) for x in s.engine_logprobs] + after if complete else none)
        engine_mask.append(mask[-1] if complete else none)

    def floats(rows: list) -> torch.Tensor:
        return torch.tensor(rows, dtype=torch.float32).to(device)

    ids_t = torch.tensor(ids, dtype=torch.long).to(device)
    advantages = floats([[s.advantage] for s in samples])
    shared = pack_shared(samples, length, device) if share_prompts else None
    return MicroBatch(
        ids_t, floats(mask), advantages, floats(engine), floats(engine_mask), index=list(index), shared=shared
    )


def plan_steps(
    samples: list[Sample], rank: int, world_size: int, gbs: int, cfg: AlgorithmConfig, device
) -> list[list[MicroBatch]]:
    """This rank's micro-batches of each optimizer step (every rank runs the same number)."""
    budget = cfg.token_budget
    if budget is None:
        plan = plan_by_count(len(samples), world_size, gbs, cfg.micro_batch_size)
    else:
        lengths = [padded_length(len(s.prompt_ids), len(s.response_ids)) for s in samples]
        plan = plan_by_tokens(lengths, world_size, gbs, budget)
    share = cfg.shared_prompt_forward
    return [[collate([samples[i] for i in mb], mb, device, share) for mb in step[rank]] for step in plan]


def logits_of(model: nn.Module, mb: MicroBatch) -> torch.Tensor:
    """[B, T-1, V]: each sample row's logits, position t predicting token t + 1."""
    if mb.shared is not None:
        return shared_logits(model, mb.shared)
    return model(input_ids=mb.input_ids, use_cache=False).logits[:, :-1]


def all_reduce_sum(t: torch.Tensor, world_size: int) -> torch.Tensor:
    if world_size > 1 and dist.is_initialized():
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t


def all_reduce_max(t: torch.Tensor, world_size: int) -> torch.Tensor:
    if world_size > 1 and dist.is_initialized():
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t
