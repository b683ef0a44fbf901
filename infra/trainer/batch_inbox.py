"""Rollout batches a trainer rank receives ahead of the call that trains on them.

A batch travels to a rank as a Ray object: the rank unpickles it (every sample, every token
list) before its method can run. Passed with the `train` call, that happens on the loop's
critical path, after the weight sync. Staged instead as soon as the rollout is made (the
`generate` task asks each rank to), a rank fetches and unpickles it in a thread of its own
while it still trains on the previous batch, and `train` finds it ready (`bench.batch_staging`
times the call both ways). On cores that are all busy the unpickling still competes with
training.

A batch that was not staged (a resumed run's first batch, a stage still on its way, a
lost stage call) is fetched from the rollout manager, as before: staging only saves time.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass

import ray

from infra.rollout.batch import RolloutBatch

# Batches a rank holds: the one it trains on and the one generated ahead (one-step off-policy).
# The oldest goes when another arrives, in the thread that stages it: freeing a batch of
# long responses (millions of token ints) takes tens of ms, which `take`, on the critical
# path, would pay.
KEEP = 2


@dataclass(frozen=True)
class FromManager:
    """Where a rank fetches a batch that was not staged: the run's rollout manager actor."""

    manager: ray.actor.ActorHandle

    def fetch(self, rollout_id: int) -> RolloutBatch:
        # the manager keeps each batch in the object store; its answer is that ref (no copy)
        return ray.get(ray.get(self.manager.batch_ref.remote(rollout_id)))


class BatchInbox:
    """The batches staged on one rank, by rollout id; thread safe (staged from a Ray
    concurrency group's thread, taken by the training thread)."""

    def __init__(self, keep: int = KEEP) -> None:
        self._keep = keep
        self._batches: OrderedDict[int, RolloutBatch] = OrderedDict()
        self._incoming: dict[int, threading.Event] = {}
        self._lock = threading.Lock()
        self.counts = {"staged": 0, "fetched": 0}  # how the batches taken arrived

    def announce(self, rollout_id: int) -> None:
        """A batch for `rollout_id` is on its way: `take` waits for it instead of fetching it
        a second time (the stage call's unpickling may still run when training asks)."""
        with self._lock:
            self._incoming.setdefault(rollout_id, threading.Event())

    def put(self, rollout_id: int, batch: RolloutBatch | None) -> None:
        """Store a staged batch (None: the stage failed; `take` then fetches it)."""
        with self._lock:
            if batch is not None:
                self._batches[rollout_id] = batch
                self._batches.move_to_end(rollout_id)
                while len(self._batches) > self._keep:
                    self._batches.popitem(last=False)
            arrived = self._incoming.pop(rollout_id, None)
        if arrived is not None:
            arrived.set()

    def take(self, rollout_id: int, source: RolloutBatch | FromManager, wait_s: float = 60.0) -> RolloutBatch:
        """Batch `rollout_id`: `source` itself when it is one (a direct call, a test), else
        the staged batch (waiting for one on its way) or one fetched from `source`. Kept for
        the rank's next call on the same rollout (the critic's values, then its step)."""
        if isinstance(source, RolloutBatch):
            return source
        with self._lock:
            arriving = self._incoming.get(rollout_id)
        if arriving is not None:
            arriving.wait(wait_s)
        with self._lock:
            batch = self._batches.get(rollout_id)
            self.counts["staged" if batch is not None else "fetched"] += 1
        if batch is None:
            batch = source.fetch(rollout_id)
            self.put(rollout_id, batch)
        return batch

    def state(self) -> dict:
        """Rollout ids held, and how the batches taken so far arrived."""
        with self._lock:
            return {"held": list(self._batches), **self.counts}
