"""Long-lived processes freeze what their start-up left alive out of the garbage collector's
full collections."""

from __future__ import annotations

import gc


def freeze_startup_heap() -> int:
    """Move every object alive now into the collector's permanent generation; returns how
    many objects are frozen.

    A full collection walks every tracked object. After importing torch and transformers a
    process tracks hundreds of thousands (modules, classes, functions: alive as long as the
    process), and the loop's allocations (a batch unpickled, a reply parsed) set off full
    collections that walk them all, milliseconds each time on the demo's critical path
    (`bench.gc_freeze`). Frozen, they are skipped; what is made after start-up is collected
    as before. No full collection runs first: after those imports one finds next to no
    garbage and costs over a tenth of a CPU-second (`bench.gc_freeze`), in the start-up,
    where every process competes for the cores.
    """
    gc.freeze()
    return gc.get_freeze_count()
