"""Full values of FSDP2-sharded parameters on rank 0, sent point to point, in place.

`DTensor.full_tensor()` is one all-gather per parameter: every rank receives every
tensor, and a bucket of dozens of small tensors pays dozens of collective round trips.
Weight sync needs the full values on rank 0 only, so each other rank sends rank 0 its
shards of a whole bucket, all at once, straight into the caller's output tensors (in
place where the dtype matches; the cast to the engines' dtype otherwise happens in a
copy).

FSDP2 shards dim 0 as `torch.chunk` does: rank r holds rows `[r*c, min((r+1)*c, n))` with
`c = ceil(n / world)`. Parameters laid out any other way (another placement, a 2-D mesh)
and plain tensors take the general path: `full_tensor()`, then a copy.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor, Shard


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


def gather_full(params: list[torch.Tensor], outs: list[torch.Tensor] | None) -> None:
    """Write the full value of every parameter into `outs` (same order, full shapes) on
    rank 0 of the parameters' mesh; the other ranks pass `outs=None` (rank 0 may too: it
    then takes part and discards). Every rank must call it with the same parameters (it is
    a collective).

    Each other rank sends rank 0 its rows of each parameter, all messages in flight at
    once. A rank's rows of a tensor are one contiguous range of the full tensor, so where
    the output has the parameter's dtype they land in place, with no copy on either side;
    otherwise through a staging tensor and a casting copy. Rank 0 copies its own rows
    while the others' arrive."""
    general = {i for i, p in enumerate(params) if not _row_sharded(p)}
    for i in sorted(general):
        full = params[i].full_tensor() if isinstance(params[i], DTensor) else params[i]
        if outs is not None:
            outs[i].copy_(full)
    sharded = [i for i in range(len(params)) if i not in general]
    if not sharded:
        return
    mesh = params[sharded[0]].device_mesh
    if any(params[i].device_mesh is not mesh for i in sharded):
        raise ValueError("gather_full: parameters on different device meshes")
    group, world, me = mesh.get_group(), mesh.size(), mesh.get_local_rank()
    if outs is not None and me != 0:
        raise ValueError(f"gather_full: outputs on mesh rank {me}; only rank 0 receives")
    if me != 0:
        sends = [
            dist.P2POp(dist.isend, local, group=group, group_peer=0, tag=i)
            for i in sharded
            if (local := params[i].to_local().detach().contiguous()).numel()
        ]
        for work in dist.batch_isend_irecv(sends) if sends else []:
            work.wait()
        return
    recvs, casts = [], []
    for r in range(1, world):
        for i in sharded:
            p = params[i]
            start, stop = _rows_of(p.shape[0], world, r)
            shape = (stop - start, *p.shape[1:])
            if math.prod(shape) == 0:  # nothing held there: nothing sent (see above)
                continue
            target = outs[i][start:stop] if outs is not None else None
            if target is None or target.dtype != p.dtype or not target.is_contiguous():
                staged = torch.empty(shape, dtype=p.dtype, device=p.to_local().device)
                if target is not None:
                    casts.append((target, staged))
                target = staged
            recvs.append(dist.P2POp(dist.irecv, target, group=group, group_peer=r, tag=i))
    works = dist.batch_isend_irecv(recvs) if recvs else []
    if outs is not None:  # rank 0's own rows, while the others' arrive
        for i in sharded:
            start, stop = _rows_of(params[i].shape[0], world, 0)
            if stop > start:
                outs[i][start:stop].copy_(params[i].to_local())
    for work in works:
        work.wait()
    for target, staged in casts:
        target.copy_(staged)
