"""The only place that shards a model: FSDP2 `fully_shard`, torchtitan style.

Model code never mentions parallelism; the trainer calls `parallelize` once after loading.
"""

from __future__ import annotations

import os
from datetime import timedelta

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard


def device_type() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def init_distributed(
    rank: int, world_size: int, master_addr: str, master_port: int, timeout_s: float = 600
) -> None:
    """Join the trainers' default process group: nccl on GPUs, gloo on CPUs."""
    if torch.cuda.is_available():
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank % torch.cuda.device_count())))
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    dist.init_process_group(
        backend,
        init_method=f"tcp://{master_addr}:{master_port}",
        rank=rank,
        world_size=world_size,
        timeout=timedelta(seconds=timeout_s),
    )


def _decoder_layers(model: nn.Module) -> list[nn.Module]:
    # HF models name their repeated block in `_no_split_modules` (e.g. LlamaDecoderLayer):
    # the natural FSDP unit, found without knowing the architecture.
    names = set(getattr(model, "_no_split_modules", None) or [])
    layers = [m for m in model.modules() if type(m).__name__ in names]
    if not layers:
        raise ValueError(f"{type(model).__name__}: no decoder layers found (_no_split_modules={names})")
    return layers


def parallelize(model: nn.Module, world_size: int) -> nn.Module:
    """Shard every decoder layer, then the root (embeddings, final norm, head), in place.

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
    return model
