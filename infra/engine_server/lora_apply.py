"""How a LoRA adapter enters a forward pass: y = W x + scaling * B (A x), unmerged.

The lean Llama step fuses projections that read one input into one matmul (q/k/v, and
gate/up); their adapters are fused the same way: one matmul with every A side by side,
then one with the B's laid out in the fused output's rows. transformers' own forward (the
path for other models) gets forward hooks on the adapted layers for the batch's duration.
The B's come pre-scaled (`LoraAdapter.modules`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import torch
import torch.nn.functional as F

Pair = tuple[torch.Tensor, torch.Tensor]


class StackedLora:
    """The adapters of the projections of one fused matmul: `add(y, x)` is y + B (A x)."""

    def __init__(self, a: torch.Tensor, b_t: torch.Tensor) -> None:
        self.a, self.b_t = a, b_t  # A's stacked [R, in]; B's placed, transposed [R, out]

    def add(self, y: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        return torch.addmm(y, F.linear(x, self.a), self.b_t)


def stacked(
    pairs: dict[str, Pair],
    outputs: list[tuple[str, int, Callable[[torch.Tensor], torch.Tensor] | None]],
    in_scale: torch.Tensor | None = None,
) -> StackedLora | None:
    """The adapters of a fused matmul whose output rows are `outputs` in order: each
    (projection, rows, a transform of its B's rows or None). A projection may appear twice
    (the lean step's RoPE-rotated copies of q and k): its A is used once. `in_scale`: the
    per-column scale folded into the matmul's weights (a norm's weight), folded into the A's
    too. None when no projection of the matmul is adapted."""
    names = list(dict.fromkeys(name for name, _, _ in outputs if name in pairs))
    if not names:
        return None
    a = torch.cat([pairs[name][0] for name in names])
    if in_scale is not None:
        a = a * in_scale
    columns, start = {}, 0
    for name in names:
        rank = pairs[name][0].shape[0]
        columns[name] = slice(start, start + rank)
        start += rank
    b = a.new_zeros(sum(rows for _, rows, _ in outputs), start)
    row = 0
    for name, rows, transform in outputs:
        if name in pairs:
            block = pairs[name][1]
            b[row : row + rows, columns[name]] = transform(block) if transform else block
        row += rows
    return StackedLora(a, b.t())


def add_single(y: torch.Tensor, x: torch.Tensor, pair: Pair | None) -> torch.Tensor:
    """y + B (A x) for one projection (y unchanged without an adapter)."""
    if pair is None:
        return y
    return torch.addmm(y, F.linear(x, pair[0]), pair[1].t())


@contextlib.contextmanager
def hooked(model: torch.nn.Module, modules: dict[str, Pair] | None) -> Iterator[None]:
    """Every adapted linear layer of `model` adds its B (A x) while the block runs."""
    handles = []
    try:
        for name, (a, b) in (modules or {}).items():

            def add(module, inputs, output, a=a, b=b):
                return output + F.linear(F.linear(inputs[0], a), b)

            handles.append(model.get_submodule(name).register_forward_hook(add))
        yield
    finally:
        for handle in handles:
            handle.remove()
