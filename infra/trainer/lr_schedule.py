"""LR multiplier per optimizer step: linear warm-up, then constant, linear or cosine decay."""

from __future__ import annotations

import math


def lr_factor(step: int, *, warmup: int, total: int, kind: str, min_ratio: float) -> float:
    """Multiplier of the base LR at optimizer step `step` (0-based).

    Warm-up: (step + 1) / warmup for the first `warmup` steps, so the first step already
    moves. Then `constant` stays at 1; `linear` and `cosine` go from 1 down to `min_ratio`,
    reached at step `total - 1` and kept after it.
    """
    if warmup and step < warmup:
        return (step + 1) / warmup
    if kind == "constant":
        return 1.0
    span = max(total - 1 - warmup, 1)
    progress = min(max(step - warmup, 0) / span, 1.0)
    if kind == "linear":
        decay = 1.0 - progress
    elif kind == "cosine":
        decay = 0.5 * (1.0 + math.cos(math.pi * progress))
    else:
        raise ValueError(f"algorithm.lr_schedule={kind!r} is not constant, linear or cosine")
    return min_ratio + (1.0 - min_ratio) * decay
