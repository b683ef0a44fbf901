"""Non-finite checks that every rank answers the same way (a flag reduced with MAX)."""

from __future__ import annotations

import math

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor


class NonFiniteStateError(RuntimeError):
    """The model or optimizer holds NaN/inf values; such a state is never checkpointed."""


def any_rank(flag: bool, world_size: int) -> bool:
    """True on every rank when `flag` is true on any rank (a collective: all ranks call it)."""
    t = torch.tensor([1.0 if flag else 0.0])
    if world_size > 1 and dist.is_initialized():
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return bool(t.item())


def is_finite(value: float | torch.Tensor) -> bool:
    return math.isfinite(float(value))


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if isinstance(t, DTensor) else t


def assert_finite_state(model: nn.Module, optimizer: torch.optim.Optimizer | None, world_size: int) -> None:
    """Raise NonFiniteStateError on every rank if any rank's shard holds a NaN/inf."""
    bad = [n for n, p in model.named_parameters() if not torch.isfinite(_local(p.detach())).all()]
    if optimizer is not None and not bad:
        for state in optimizer.state.values():
            for key, value in state.items():
                if torch.is_tensor(value) and not torch.isfinite(_local(value)).all():
                    bad.append(f"optimizer state {key}")
                    break
    if any_rank(bool(bad), world_size):
        where = f"{', '.join(bad[:5])}" if bad else "a shard on another rank"
        raise NonFiniteStateError(
            f"refusing to checkpoint a non-finite training state (NaN/inf in {where}); "
            "the last complete checkpoint is kept"
        )
