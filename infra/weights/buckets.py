"""Grouping of parameters into weight-sync buckets.

A bucket bounds what is gathered to full size at once (memory on every trainer rank) and
what one `update_weights_from_distributed` request announces to an engine.
"""

from __future__ import annotations

import torch

# SGLang's `load_format` for a bucket broadcast as one uint8 buffer: the tensors' bytes back
# to back, in the order of the names (its FlattenedTensorBucket layout, no padding)
FLATTENED_BUCKET = "flattened_bucket"


def bucket_params(named_sizes: list[tuple[str, int]], bucket_bytes: int) -> list[list[str]]:
    """Split `(name, nbytes)` pairs, in order, into buckets of at most `bucket_bytes`.

    Order is kept because the engine receives the tensors of a bucket by broadcasts in
    the order of its names. A tensor larger than a bucket travels alone.
    """
    if bucket_bytes <= 0:
        raise ValueError(f"bucket_bytes must be positive, got {bucket_bytes}")
    buckets: list[list[str]] = []
    current: list[str] = []
    current_bytes = 0
    for name, nbytes in named_sizes:
        if current and current_bytes + nbytes > bucket_bytes:
            buckets.append(current)
            current, current_bytes = [], 0
        current.append(name)
        current_bytes += nbytes
    if current:
        buckets.append(current)
    return buckets


def dtype_name(dtype: torch.dtype) -> str:
    """`torch.float32` -> `"float32"`: the spelling SGLang's weight-update requests use."""
    return str(dtype).removeprefix("torch.")
