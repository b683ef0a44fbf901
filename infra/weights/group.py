"""The weight-update process group between trainer rank 0 and the rollout engines' ranks.

SGLang's engines join it with their own `init_custom_process_group`, which keys every
store entry in a particular way: a `tcp://` rendezvous gives a TCPStore, that store is
wrapped in `PrefixStore(group_name, ...)`, and torch's `_new_process_group_helper` adds
its own `"{group_name}/"` and backend prefixes on top. A group built any other way (a raw
TCPStore handed to `ProcessGroupGloo`, say) waits on different keys and never meets the
engines. So this module builds the group by exactly that recipe, on both sides: the
trainer here, and the built-in engine server too, so the CPU suite exercises the layout
the GPUs use. The conformance tests (`pytest -m sglang`) hold it against SGLang's own
function.

Rank 0 (the trainer) hosts the store. It binds it first, on a port the OS picks
(`host_update_store`), and only then tells the engines that port: no other process can
take the port between a probe and the bind. The store is the TCPStore the `tcp://`
rendezvous would have made, so the key layout is the same.

The group lives beside whatever default world a process already has (the trainer ranks
keep their FSDP group; an engine process needs none). Ranks: the trainer is 0; an engine
with tensor parallelism tp takes `rank_offset + tp_rank`, tp ranks in all.
"""

from __future__ import annotations

from datetime import timedelta

import torch
import torch.distributed as dist
from torch.distributed.distributed_c10d import (
    Backend,
    PrefixStore,
    _new_process_group_helper,
    _world,
    rendezvous,
)

from infra.cluster.network import host_tcp_store


def host_update_store(
    master_address: str, world_size: int, timeout_s: float = 300, port: int = 0
) -> dist.TCPStore:
    """Rank 0's store for the group, already listening on `port` (0: one the OS picks); tell
    the other ranks `store.port`."""
    return host_tcp_store(master_address, world_size, timeout_s, port)


def open_update_group(
    master_address: str,
    master_port: int,
    rank: int,
    world_size: int,
    group_name: str = "weight_update_group",
    timeout_s: float = 300,
    backend: str = "gloo",
    store: dist.Store | None = None,
) -> dist.ProcessGroup:
    """Join the group; blocks until all `world_size` ranks have joined. Rank 0 passes the
    `store` it hosts (`host_update_store`); the others (and a rank 0 without one) go through
    the `tcp://` rendezvous at `master_address:master_port`, as SGLang's engines do."""
    if backend not in ("gloo", "nccl"):
        raise ValueError(f"backend: unknown weight-update backend {backend!r} (gloo or nccl)")
    if backend == "nccl" and not dist.is_nccl_available():
        # checked before the group forms, so the other ranks time out instead of joining
        raise RuntimeError("backend: nccl is not available in this torch build (CPU only); use gloo")
    if not 0 <= rank < world_size:
        raise ValueError(f"rank: {rank} is outside the group of {world_size}")
    timeout = timedelta(seconds=timeout_s)
    if store is None:
        # rendezvous yields (store, rank, world_size) once; the TCPStore is hosted by rank 0
        store, rank, world_size = next(
            rendezvous(f"tcp://{master_address}:{master_port}", rank, world_size, timeout=timeout)
        )
    store.set_timeout(timeout)
    prefixed = PrefixStore(group_name, store)
    group, _ = _new_process_group_helper(
        world_size,
        rank,
        [],
        Backend(backend),
        prefixed,
        group_name=group_name,
        backend_options=None,
        timeout=timeout,
    )
    # identity rank map, as SGLang registers it: torch.distributed's collectives on this
    # group then translate ranks without a default world
    _world.pg_group_ranks[group] = {i: i for i in range(world_size)}
    return group


def close_update_group(group: dist.ProcessGroup) -> None:
    """Tear the group down and forget it (a later group of the same name starts clean)."""
    try:
        dist.destroy_process_group(group)
    except (ValueError, RuntimeError, KeyError):
        # not registered as a torch.distributed group (or already gone): shut the backend
        group.shutdown()


def broadcast_async(group: dist.ProcessGroup, tensor: torch.Tensor, src: int = 0) -> dist.Work:
    """Start broadcasting `tensor` in place from rank `src` of `group`; `.wait()` the result.
    Several may be in flight: the group runs them in the order they were started."""
    opts = dist.BroadcastOptions()
    opts.rootRank = src
    return group.broadcast([tensor], opts)


def broadcast(group: dist.ProcessGroup, tensor: torch.Tensor, src: int = 0) -> None:
    """Broadcast `tensor` in place from rank `src` of `group` (a send on src, a receive elsewhere)."""
    broadcast_async(group, tensor, src).wait()
