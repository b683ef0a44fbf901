"""Long-lived processes freeze what their start-up left alive out of the garbage collector's
full collections."""

from __future__ import annotations

import gc


def freeze_startup_heap() -> int:
    """Collect the start-up's garbage, then move every object alive now into the collector's
    permanent generation; returns how many objects are frozen.

    A full collection walks every tracked object. After importing torch and transformers a
    process tracks hundreds of thousands (modules, classes, functions: alive as long as the
    process), and the loop's allocations (a batch unpickled, a reply parsed) set off full
    collections that walk them all, tens of ms each time on the demo's critical path
    (`bench.gc_freeze`). Frozen, they are skipped; what is made after start-up is still
    collected as before. Call it once the process is set up, again after a reload.
    """
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()
