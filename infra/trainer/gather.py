"""Full values of FSDP2-sharded parameters on rank 0, one collective per bucket.

`DTensor.full_tensor()` is one all-gather per parameter: every rank receives every
tensor, and a bucket of dozens of small tensors pays dozens of collective round trips.
Weight sync needs the full values on rank 0 only, so each rank lays its local shards of a
whole bucket into one byte buffer and a single `gather` brings them to rank 0, which
copies every rank's rows straight into the caller's output tensors (of any dtype: the
cast to the engines' dtype happens in that copy).

FSDP2 shards dim 0 as `torch.chunk` does: rank r holds rows `[r*c, min((r+1)*c, n))` with
`c = ceil(n / world)`. Parameters laid out any other way (another placement, a 2-D mesh)
and plain tensors take the general path: `full_tensor()`, then a copy.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor, Shard

_ALIGN = 16  # byte offsets in the buffer: any dtype's view of a slice must be aligned


def _row_sharded(param: torch.Tensor) -> bool:
    return (
        isinstance(param, DTensor)
        and param.device_mesh.ndim == 1
        and tuple(param.placements) == (Shard(0),)
        and param.dim() > 0
    )


def _rows_of(n: int, world: int, rank: int) -> tuple[int, int]:
    """The rows `[start, stop)` of a dim of size n that `rank` holds (torch.chunk's split)."""
    chunk = math.ceil(n / world) if n else 0
    start = min(rank * chunk, n)
    return start, min(start + chunk, n)


def _aligned(nbytes: int) -> int:
    return (nbytes + _ALIGN - 1) // _ALIGN * _ALIGN


def gather_full(params: list[torch.Tensor], outs: list[torch.Tensor] | None) -> None:
    """Write the full value of every parameter into `outs` (same order, full shapes) on
    rank 0 of the parameters' mesh; the other ranks pass `outs=None` (rank 0 may too: it
    then takes part and discards). Every rank must call it with the same parameters (it is
    a collective)."""
    sharded = [i for i, p in enumerate(params) if _row_sharded(p)]
    for i, param in enumerate(params):
        if i not in sharded:  # the general path, collective for a DTensor
            full = param.full_tensor() if isinstance(param, DTensor) else param
            if outs is not None:
                outs[i].copy_(full)
    if not sharded:
        return
    mesh = params[sharded[0]].device_mesh
    if any(params[i].device_mesh is not mesh for i in sharded):
        raise ValueError("gather_full: parameters on different device meshes")
    group, world, me = mesh.get_group(), mesh.size(), mesh.get_local_rank()
    if outs is not None and me != 0:
        raise ValueError(f"gather_full: outputs on mesh rank {me}; only rank 0 receives")
    # per parameter: its byte offset in every rank's buffer (each rank's slot is the same
    # size: the largest shard, so one buffer layout serves all ranks)
    layout, size = [], 0
    for i in sharded:
        p = params[i]
        row_bytes = math.prod(p.shape[1:]) * p.element_size()  # from metadata: no collective
        slot = math.ceil(p.shape[0] / world) * row_bytes
        layout.append((i, size, row_bytes))
        size += _aligned(slot)
    device = params[sharded[0]].to_local().device
    mine = torch.empty(size, dtype=torch.uint8, device=device)
    for i, offset, _ in layout:
        local = params[i].to_local().detach().contiguous()
        flat = local.reshape(-1).view(torch.uint8)
        mine[offset : offset + flat.numel()].copy_(flat)
    if me != 0:
        dist.gather(mine, None, group_dst=0, group=group)
        return
    received = [torch.empty_like(mine) for _ in range(world)]
    dist.gather(mine, received, group_dst=0, group=group)
    if outs is None:  # rank 0 took part only to keep the ranks in step
        return
    for i, offset, row_bytes in layout:
        p, out = params[i], outs[i]
        for r in range(world):
            start, stop = _rows_of(p.shape[0], world, r)
            if stop > start:
                part = received[r][offset : offset + (stop - start) * row_bytes]
                out[start:stop].copy_(part.view(p.dtype).view(stop - start, *p.shape[1:]))
