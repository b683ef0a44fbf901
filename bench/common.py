"""Small helpers every bench script shares: repeat statistics and the printed lines."""

from __future__ import annotations

import statistics
from collections.abc import Sequence


def spread(values: Sequence[float], fmt: str = "{:.3f}") -> str:
    """`median (min .. max, n=K)` of repeated measurements."""
    lo, mid, hi = min(values), statistics.median(values), max(values)
    return f"{fmt.format(mid)} (min {fmt.format(lo)}, max {fmt.format(hi)}, n={len(values)})"


def ratio_line(name: str, ratios: Sequence[float], goal: str) -> str:
    """The one line the results file quotes: the ratio's median, min and max, and its goal."""
    return f"RATIO {name}: {spread(ratios, '{:.2f}x')}; goal {goal}"
