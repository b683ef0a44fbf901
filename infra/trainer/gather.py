"""Full values of FSDP2-sharded parameters on rank 0, one message per rank per bucket.

`DTensor.full_tensor()` is one all-gather per parameter: every rank receives every
tensor, and a bucket of dozens of small tensors pays dozens of collective round trips.
Weight sync needs the full values on rank 0 only, so each rank lays its local shards of a
whole bucket into one byte buffer and sends it to rank 0 (one message per rank per
bucket), which copies every rank's rows straight into the caller's output tensors (of any
dtype: the cast to the engines' dtype happens in that copy).

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


def _layout(params: list[torch.Tensor], world: int, rank: int) -> tuple[list[tuple[int, int, int]], int]:
    """Where each parameter's rows of `rank` sit in that rank's buffer: (offset, start,
    stop) per parameter, and the buffer's size in bytes. Known to every rank from the
    parameters' global shapes alone."""
    layout, size = [], 0
    for p in params:
        start, stop = _rows_of(p.shape[0], world, rank)
        layout.append((size, start, stop))
        size += _aligned((stop - start) * math.prod(p.shape[1:]) * p.element_size())
    return layout, size


def _rows(buffer: torch.Tensor, offset: int, start: int, stop: int, like: torch.Tensor) -> torch.Tensor:
    nbytes = (stop - start) * math.prod(like.shape[1:]) * like.element_size()
    return buffer[offset : offset + nbytes].view(like.dtype).view(stop - start, *like.shape[1:])


def gather_full(params: list[torch.Tensor], outs: list[torch.Tensor] | None) -> None:
    """Write the full value of every parameter into `outs` (same order, full shapes) on
    rank 0 of the parameters' mesh; the other ranks pass `outs=None` (rank 0 may too: it
    then takes part and discards). Every rank must call it with the same parameters (it is
    a collective).

    Each other rank sends rank 0 one buffer holding its rows of every parameter; rank 0
    copies its own rows into `outs` while those arrive, then theirs."""
    general = [i for i, p in enumerate(params) if not _row_sharded(p)]
    for i in general:
        full = params[i].full_tensor() if isinstance(params[i], DTensor) else params[i]
        if outs is not None:
            outs[i].copy_(full)
    sharded = [params[i] for i in range(len(params)) if i not in set(general)]
    if not sharded:
        return
    mesh = sharded[0].device_mesh
    if any(p.device_mesh is not mesh for p in sharded):
        raise ValueError("gather_full: parameters on different device meshes")
    group, world, me = mesh.get_group(), mesh.size(), mesh.get_local_rank()
    if outs is not None and me != 0:
        raise ValueError(f"gather_full: outputs on mesh rank {me}; only rank 0 receives")
    sharded_outs = (
        [outs[i] for i in range(len(params)) if i not in set(general)] if outs is not None else None
    )
    device = sharded[0].to_local().device
    if me != 0:
        layout, size = _layout(sharded, world, me)
        mine = torch.empty(size, dtype=torch.uint8, device=device)
        for p, (offset, start, stop) in zip(sharded, layout, strict=True):
            if stop > start:
                _rows(mine, offset, start, stop, p).copy_(p.to_local())
        dist.send(mine, group_dst=0, group=group)
        return
    layouts = [_layout(sharded, world, r) for r in range(world)]
    buffers = {r: torch.empty(layouts[r][1], dtype=torch.uint8, device=device) for r in range(1, world)}
    works = [dist.irecv(buffers[r], group_src=r, group=group) for r in range(1, world)]
    if sharded_outs is not None:  # rank 0's own rows, while the others' arrive
        for p, out, (_, start, stop) in zip(sharded, sharded_outs, layouts[0][0], strict=True):
            if stop > start:
                out[start:stop].copy_(p.to_local())
    for work in works:
        work.wait()
    if sharded_outs is None:  # rank 0 took part only to keep the ranks in step
        return
    for r in range(1, world):
        for p, out, (offset, start, stop) in zip(sharded, sharded_outs, layouts[r][0], strict=True):
            if stop > start:
                out[start:stop].copy_(_rows(buffers[r], offset, start, stop, p))
