"""One training call, as a pipeline: the rollout's samples -> the plan of collated
micro-batches -> the old and reference logprobs -> the advantages -> ppo_epochs passes of
(the step's policy loss and backward -> the guarded optimizer step)."""

from __future__ import annotations

import torch
from torch import nn

from infra.config import AlgorithmConfig
from infra.rollout.batch import Sample
from infra.trainer.advantage_stage import PublishKL, set_advantages
from infra.trainer.batches import plan_steps
from infra.trainer.objective import PolicyObjective
from infra.trainer.offpolicy import old_and_ref_logprobs
from infra.trainer.optimizer_step import OptimizerSteps
from infra.trainer.parallelize import micro_batches


def train_on_batch(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    samples: list[Sample],
    *,
    rank: int,
    world_size: int,
    cfg: AlgorithmConfig,
    global_batch_size: int,
    temperature: float,
    ref_model: nn.Module | None = None,
    tis: bool = False,
    max_response_len: int = 1,
    rollout_id: int | None = None,
    values: list[list[float]] | None = None,
    publish_kl: PublishKL | None = None,
    old_pass: bool = False,
) -> dict:
    """Train on one rollout; every rank gets the same `samples` and returns the same metrics.

    `old_pass`: give the old logprobs a no-grad pass of their own before the steps even
    where the step's forward could give them (`old_logprobs_from_first_step`); only to
    measure or test what leaving the pass out changes (the result is the same).

    ppo: `values` (the critic's, per response token) replace the samples' scalar advantages
    by per-token GAE advantages; see `set_advantages` for `publish_kl`.

    `rollout_id` is the trainer's weight version (iterations trained so far): samples
    generated with that version measure the engine/trainer numeric mismatch; the others
    are stale by `rollout_id - weight_version`.
    """
    if not samples or len(samples) % global_batch_size or global_batch_size % world_size:
        raise ValueError(
            f"{len(samples)} samples must split into steps of global_batch_size={global_batch_size}, "
            f"itself divisible by world_size={world_size}"
        )
    device = next(model.parameters()).device
    plan = plan_steps(samples, rank, world_size, global_batch_size, cfg, device)
    # the old-policy pass and the first step see the same weights: gathered once for both
    with micro_batches(model) as fsdp:
        old = old_and_ref_logprobs(
            model, ref_model, plan, samples, cfg, temperature,
            tis=tis, rollout_id=rollout_id, old_pass=old_pass,
        )  # fmt: skip
        advantages = set_advantages(plan, samples, cfg, world_size, values=values, publish_kl=publish_kl)
        loss = PolicyObjective(
            cfg, old, world_size, device, temperature=temperature, max_response_len=max_response_len
        )
        steps = OptimizerSteps(model, optimizer, scheduler, cfg.grad_clip, world_size)
        for step in (step for _ in range(cfg.ppo_epochs) for step in plan):
            steps.take(loss.backward(model, step, fsdp))
    stats = {**loss.metrics(), **steps.metrics()}
    return {**old.metrics(world_size), **advantages, **stats}
