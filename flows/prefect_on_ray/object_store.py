"""Values every task run of a flow run gets, put in Ray's object store once and unpickled once
per worker.

Ray pickles a task's arguments at every submit and unpickles them in the worker before the
body runs. For what is the same object for the whole flow run (the flow run's serialized
context, the run's handles) that is repeated work: a py-spy profile of the demo's task-run
workers spent about a fifth of their CPU unpickling task arguments, most of it the handles
(their actor handles alone, each registered again with the worker's core worker, about 9%).
Task runs carry a reference instead.

The flow side keys a value by its identity and keeps it alive, so the id stays its own;
values are never edited in place once handed to task runs (the flow builds new ones).
"""

from __future__ import annotations

import ray


class PutOnce:
    """Flow side: the object-store reference of a value, put on its first use."""

    def __init__(self, keep: int = 4) -> None:
        self.keep = keep
        self.kept: dict[int, tuple[object, ray.ObjectRef]] = {}

    def __call__(self, value: object) -> ray.ObjectRef:
        hit = self.kept.get(id(value))
        if hit is None or hit[0] is not value:
            if len(self.kept) >= self.keep:  # each entry holds its value alive: a few recent ones
                self.kept.clear()
            hit = self.kept[id(value)] = (value, ray.put(value))
        return hit[1]


class GetOnce:
    """Worker side: a stored value, fetched and unpickled on its first use in this process."""

    def __init__(self, keep: int = 4) -> None:
        self.keep = keep
        self.loaded: dict[str, object] = {}

    def __call__(self, ref: ray.ObjectRef) -> object:
        key = ref.hex()
        if key not in self.loaded:
            if len(self.loaded) >= self.keep:
                self.loaded.clear()
            self.loaded[key] = ray.get(ref)
        return self.loaded[key]
