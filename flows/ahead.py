"""The generate task run submitted one iteration ahead, and the batch it produced.

The seed's loop keeps one `next` future: wait it for this iteration's data, submit the next
generate, and wait it again before a weight sync (no generation in flight while weights
change) or a save (the batch generated ahead is part of the checkpoint). This object is
that bookkeeping, so the flow reads like the loop.
"""

from __future__ import annotations

from collections.abc import Callable

from prefect.futures import PrefectFuture


class GenerateAhead:
    def __init__(self, submit: Callable[[int, list[PrefectFuture]], PrefectFuture]) -> None:
        self._submit = submit  # (rollout_id, wait_for) -> future of the generate task run
        self._future: PrefectFuture | None = None
        self._ready: dict | None = None  # a batch drained but not yet taken
        self._last: list[PrefectFuture] = []  # the previous generate: runs reach the actor in order

    def submit(self, rollout_id: int) -> None:
        self._future = self._submit(rollout_id, self._last)

    def in_flight(self) -> list[PrefectFuture]:
        """The generate task run in flight, if any (for a task run that must start after it)."""
        return [self._future] if self._future is not None else []

    def drain(self) -> None:
        """Wait the generation in flight, if any; its batch is kept for the next `take`."""
        if self._future is not None:
            self._ready, self._last, self._future = self._future.result(), [self._future], None

    def take(self, rollout_id: int) -> dict:
        """The summary of batch `rollout_id`, generating it now if nothing is ahead."""
        if self._future is None and self._ready is None:
            self.submit(rollout_id)
        self.drain()
        ready, self._ready = self._ready, None
        return ready
