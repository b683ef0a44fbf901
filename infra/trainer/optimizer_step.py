"""The guarded optimizer step: clip the gradients, step the optimizer and the LR schedule,
unless the loss or the gradient is not finite on some rank."""

from __future__ import annotations

import torch
from torch import nn
from torch.distributed.tensor import DTensor

from infra.trainer.nonfinite import any_rank, is_finite


def grad_norm(model: nn.Module) -> torch.Tensor:
    # Torchtitan's recipe: the norm of FSDP2's sharded DTensor grads is a partial result;
    # full_tensor() reduces it across ranks into the true global norm (same on every rank).
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    total = torch.nn.utils.get_total_norm(grads, norm_type=2.0)
    return total.full_tensor() if isinstance(total, DTensor) else total


def clip_grads(model: nn.Module, max_norm: float, total: torch.Tensor) -> None:
    params = [p for p in model.parameters() if p.grad is not None]
    torch.nn.utils.clip_grads_with_norm_(params, max_norm, total)


def guarded_step(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    step_loss: torch.Tensor,
    max_norm: float,
    world_size: int,
) -> float | None:
    """Clip the gradients and apply one optimizer and LR-schedule step; returns the gradient
    norm before clipping. A NaN/inf loss or gradient would poison the weights: then no step
    is taken on any rank (the gradients are dropped) and None is returned."""
    norm = grad_norm(model)
    if any_rank(not (is_finite(step_loss) and is_finite(norm)), world_size):
        optimizer.zero_grad(set_to_none=True)
        return None
    clip_grads(model, max_norm, norm)
    optimizer.step()
    scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    return float(norm)


class OptimizerSteps:
    """The guarded steps of one training call, and what they report: the mean loss and
    gradient norm of the steps taken, the last learning rate, the steps skipped."""

    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        scheduler: torch.optim.lr_scheduler.LRScheduler,
        max_norm: float,
        world_size: int,
    ) -> None:
        self.model, self.optimizer, self.scheduler = model, optimizer, scheduler
        self.max_norm, self.world_size = max_norm, world_size
        self.losses: list[float] = []
        self.grad_norms: list[float] = []
        self.lr, self.steps, self.skipped = 0.0, 0, 0

    def take(self, step_loss: torch.Tensor) -> None:
        self.steps += 1
        self.lr = self.scheduler.get_last_lr()[0]
        norm = guarded_step(
            self.model, self.optimizer, self.scheduler, step_loss, self.max_norm, self.world_size
        )
        if norm is None:  # a skipped step (non-finite loss or gradient)
            self.skipped += 1
            return
        self.losses.append(float(step_loss))
        self.grad_norms.append(norm)

    def metrics(self) -> dict:
        return {
            "loss": sum(self.losses) / len(self.losses) if self.losses else 0.0,
            "grad_norm": sum(self.grad_norms) / len(self.grad_norms) if self.grad_norms else 0.0,
            "lr": self.lr,
            "num_steps": self.steps,
            "skipped_steps": self.skipped,
        }
