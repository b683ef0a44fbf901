"""The weight-update process group between trainer rank 0 and the rollout engines.

It is built directly from a TCPStore rather than with `init_process_group`, so it lives
beside whatever default world a process already has: the trainer ranks keep their own
gloo/nccl default group, and an engine process (outside that world) needs none. SGLang's
`init_weights_update_group` builds the same thing with nccl on GPUs; this module builds it
with gloo on CPUs and with nccl where asked (GPU only).
"""

from __future__ import annotations

from datetime import timedelta

import torch
import torch.distributed as dist


def open_update_group(
    master_address: str,
    master_port: int,
    rank: int,
    world_size: int,
    timeout_s: float = 300,
    backend: str = "gloo",
) -> dist.ProcessGroup:
    """Join the group; blocks until all `world_size` ranks have joined (rank 0 hosts the store)."""
    if backend not in ("gloo", "nccl"):
        raise ValueError(f"backend: unknown weight-update backend {backend!r} (gloo or nccl)")
    if backend == "nccl" and not dist.is_nccl_available():
        # checked before the store exists, so the other ranks time out instead of joining
        raise RuntimeError("backend: nccl is not available in this torch build (CPU only); use gloo")
    timeout = timedelta(seconds=timeout_s)
    store = dist.TCPStore(master_address, master_port, world_size, is_master=(rank == 0), timeout=timeout)
    if backend == "gloo":
        return dist.ProcessGroupGloo(store, rank, world_size, timeout)
    # GPU-only path: CPU builds of torch have no ProcessGroupNCCL, so it cannot run on CI
    # machines; on GPUs it is the group SGLang's engines join.
    nccl_options = dist.ProcessGroupNCCL.Options()
    nccl_options._timeout = timeout
    return dist.ProcessGroupNCCL(store, rank, world_size, nccl_options)


def broadcast(group: dist.ProcessGroup, tensor: torch.Tensor, src: int = 0) -> None:
    """Broadcast `tensor` in place from rank `src` of `group` (a send on src, a receive elsewhere)."""
    opts = dist.BroadcastOptions()
    opts.rootRank = src
    group.broadcast([tensor], opts).wait()
