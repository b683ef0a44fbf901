"""The payload of one weight-sync bucket: what rank 0 broadcasts, in the engines' dtype.

Either one flat byte buffer holding the bucket's tensors back to back (SGLang's
`flattened_bucket` layout) or the tensors themselves, and per tensor a view of it to fill.
"""

from __future__ import annotations

import torch


def _views(flat: torch.Tensor, sizes: list[torch.Size]) -> list[torch.Tensor]:
    views, offset = [], 0
    for size in sizes:
        views.append(flat[offset : offset + size.numel()].view(size))
        offset += size.numel()
    return views


def empty_bucket(
    shapes: list[list[int]], dtype: torch.dtype, flatten: bool, device: torch.device | str = "cpu"
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """A new, empty payload for a bucket of these shapes in `dtype`, and per tensor a view
    of it to fill: one flat byte buffer holding the tensors back to back (`flatten`), or the
    tensors themselves. All share one dtype, so every tensor's byte offset is a multiple of
    its element size, as SGLang's flattened receiver requires."""
    if not flatten:
        outs = [torch.empty(shape, dtype=dtype, device=device) for shape in shapes]
        return outs, outs
    sizes = [torch.Size(shape) for shape in shapes]
    flat = torch.empty(sum(s.numel() for s in sizes), dtype=dtype, device=device)
    return [flat.view(torch.uint8)], _views(flat, sizes)


def reuse_bucket(
    payload: list[torch.Tensor], shapes: list[list[int]], dtype: torch.dtype, flatten: bool
) -> list[torch.Tensor] | None:
    """Views to fill for a bucket of these shapes in an old payload (as `empty_bucket`
    made it), or None when it does not fit them exactly."""
    sizes = [torch.Size(shape) for shape in shapes]
    if not flatten:
        fits = len(payload) == len(sizes) and all(
            t.dtype == dtype and t.shape == s for t, s in zip(payload, sizes, strict=False)
        )
        return list(payload) if fits else None
    nbytes = sum(s.numel() for s in sizes) * dtype.itemsize
    if len(payload) != 1 or payload[0].dtype != torch.uint8 or payload[0].numel() != nbytes:
        return None
    return _views(payload[0].view(dtype), sizes)


def filled_bucket(
    tensors: list[torch.Tensor], dtype: torch.dtype, flatten: bool, device: torch.device | str
) -> list[torch.Tensor]:
    """A new payload (see `empty_bucket`) holding these tensors, cast to `dtype` (one copy each)."""
    payload, views = empty_bucket([list(t.shape) for t in tensors], dtype, flatten, device)
    for view, tensor in zip(views, tensors, strict=True):
        view.copy_(tensor)
    return payload
