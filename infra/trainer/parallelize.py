"""The only place that shards a model: FSDP2 `fully_shard`, torchtitan style.

Model code never mentions parallelism; the trainer calls `parallelize` once after loading.
"""

from __future__ import annotations

import os
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard

from infra.cluster.network import host_tcp_store

# Models parallelized with gather="per_step" (see `micro_batches`); weak, so a dropped
# model leaves no entry behind.
_GATHER_PER_STEP: weakref.WeakSet[nn.Module] = weakref.WeakSet()


def device_type() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def host_store(host: str, world_size: int, timeout_s: float = 600) -> dist.TCPStore:
    """Rank 0's rendezvous store, listening on a port the OS picked (`store.port`) before any
    other rank is told it: nothing can take the port between a probe and the bind."""
    return host_tcp_store(host, world_size, timeout_s)


def init_distributed(
    rank: int,
    world_size: int,
    master_addr: str,
    master_port: int,
    timeout_s: float = 600,
    store: dist.TCPStore | None = None,
) -> None:
    """Join the trainers' default process group: nccl on GPUs, gloo on CPUs. Rank 0 passes
    the `store` it hosts (`host_store`); without one, rank 0 hosts it on `master_port`."""
    if torch.cuda.is_available():
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank % torch.cuda.device_count())))
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    timeout = timedelta(seconds=timeout_s)
    if store is None:
        store = dist.TCPStore(master_addr, master_port, world_size, is_master=rank == 0, timeout=timeout)
    dist.init_process_group(backend, store=store, rank=rank, world_size=world_size, timeout=timeout)


def _decoder_layers(model: nn.Module) -> list[nn.Module]:
    # HF models name their repeated block in `_no_split_modules` (e.g. LlamaDecoderLayer):
    # the natural FSDP unit, found without knowing the architecture.
    names = set(getattr(model, "_no_split_modules", None) or [])
    layers = [m for m in model.modules() if type(m).__name__ in names]
    if not layers:
        raise ValueError(f"{type(model).__name__}: no decoder layers found (_no_split_modules={names})")
    return layers


def parallelize(model: nn.Module, world_size: int, gather: str = "per_step") -> nn.Module:
    """Shard every decoder layer, then the root (embeddings, final norm, head), in place.

    `gather` (`cluster.fsdp_gather`): how often the sharded weights are all-gathered and the
    gradients reduce-scattered in a step of several micro-batches (see `micro_batches`).

    On GPUs parameters compute in bf16 while gradients are reduced in fp32 and the sharded
    master weights stay fp32. On CPUs everything is fp32: bf16 matmuls are slow there and
    the tests compare against exact fp32 references.
    """
    mesh = init_device_mesh(device_type(), (world_size,))
    kwargs: dict = {"mesh": mesh}
    if torch.cuda.is_available():
        kwargs["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for layer in _decoder_layers(model):
        fully_shard(layer, **kwargs)
    fully_shard(model, **kwargs)
    if gather == "per_step":
        _GATHER_PER_STEP.add(model)
    elif gather != "per_micro_batch":
        raise ValueError(f"cluster.fsdp_gather={gather!r}: expected 'per_step' or 'per_micro_batch'")
    return model


class MicroBatches:
    """What FSDP2 does around each micro-batch of one pass over a model's micro-batches."""

    def __init__(self, modules: list[FSDPModule]) -> None:
        self._modules = modules

    def before_backward(self, last: bool) -> None:
        """Called before each micro-batch's backward; `last`: the step's last micro-batch.

        Until the last one, gradients accumulate whole on every rank and the weights stay
        gathered; the last backward reduce-scatters the sum and frees the gathered weights, so
        the optimizer steps on the shards as always."""
        for m in self._modules:
            m.set_requires_gradient_sync(last, recurse=False)
            m.set_reshard_after_backward(last, recurse=False)


@contextmanager
def micro_batches(*models: nn.Module | None) -> Iterator[MicroBatches]:
    """Around a pass of forwards (and backwards) over micro-batches of the same weights.

    With gather="per_step" the weights are all-gathered by the pass's first forward and kept
    until the step's last backward (or the pass's end), and gradients are reduce-scattered
    once per step, not once per micro-batch: per FSDP unit, one all-gather and one
    reduce-scatter a step instead of two all-gathers and a reduce-scatter per micro-batch.
    The cost is DDP's memory during the step: whole weights and whole gradients on every rank.
    With "per_micro_batch", or on an unsharded model, FSDP runs as configured (nothing changes).
    """
    sharded = [model for model in models if model is not None and model in _GATHER_PER_STEP]
    modules = [m for model in sharded for m in model.modules() if isinstance(m, FSDPModule)]
    roots = {id(model) for model in sharded}
    for m in modules:
        m.set_reshard_after_forward(False, recurse=False)
    try:
        yield MicroBatches(modules)
    finally:
        # back to fully_shard's defaults: decoder layers free their gathered weights after
        # forward and backward, the root keeps them between its forward and backward
        for m in modules:
            m.reshard()
            m.set_reshard_after_forward(id(m) not in roots, recurse=False)
            m.set_requires_gradient_sync(True, recurse=False)
            m.set_reshard_after_backward(True, recurse=False)
