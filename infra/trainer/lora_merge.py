"""Full weights with the LoRA adapter merged in, on a sharded model, for a weight push.

A push sends the base model's tensors under the base model's names. With an adapter, the
adapted weights are sent merged: W + (alpha / r) * B @ A. FSDP2 shards W [out, in] and
B [out, r] both by rows of `out` over the same mesh, so a rank's rows of the merged weight
are its rows of W plus its rows of B times the whole of A (small: [r, in], one all-gather
per layer). Each rank merges into its own shard in place for the push and puts back an
exact copy afterwards: subtracting the delta again would not restore the frozen weights
bit for bit.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn
from torch.distributed.tensor import DTensor

from infra.model.lora import base_name, is_adapter_param, lora_layers, merge_delta


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if isinstance(t, DTensor) else t


def _full(t: torch.Tensor) -> torch.Tensor:
    # a collective for a DTensor: every rank calls it, layer by layer in the same order
    return t.full_tensor() if isinstance(t, DTensor) else t


@contextmanager
def merged_params(model: nn.Module, merge: bool = True) -> Iterator[dict[str, torch.Tensor]]:
    """The parameters to push, by the base model's names; inside, every adapted weight holds
    its merged value (with `merge=False`, the frozen base's: what an engine that applies
    the adapter itself holds). Without an adapter: the parameters as they are. Every rank
    enters."""
    layers = lora_layers(model) if merge else []
    saved: list[tuple[torch.Tensor, torch.Tensor]] = []
    try:
        with torch.no_grad():
            for layer in layers:
                a = _full(layer.a)
                weight, b = _local(layer.weight), _local(layer.b)
                if weight.shape[0] != b.shape[0]:
                    raise ValueError(
                        f"{layer.name}: the rank holds {weight.shape[0]} rows of the weight but "
                        f"{b.shape[0]} of lora_B; both must be sharded by output rows alike"
                    )
                saved.append((weight, weight.clone()))
                weight.add_(merge_delta(b, a, layer.scale).to(weight.dtype))
        yield {base_name(name): p for name, p in model.named_parameters() if not is_adapter_param(name)}
    finally:
        with torch.no_grad():
            for weight, original in saved:
                weight.copy_(original)
