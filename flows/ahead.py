"""Task runs submitted ahead of the iteration that needs them: the generate one iteration
ahead with the batch it produced, and the next iteration's training behind this one's sync.

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


class TrainingAhead:
    """The training task runs (actor, and critic in ppo) of an iteration, submitted during
    the iteration before, behind its weight sync.

    Ray holds such a task run until its upstream is done (the runner passes the upstream as
    task arguments) and runs it then: training k+1 starts as the sync of k ends, instead of
    after the flow has read the sync's result and submitted it (its result and a new submit:
    about 0.1 s an iteration on the demo, each on the critical path). The sync itself waits for the
    batch generated ahead, so no training or generation runs while weights change.
    """

    def __init__(self, submit: Callable[[int, list[PrefectFuture]], list[PrefectFuture]]) -> None:
        self._submit = submit  # (rollout_id, wait_for) -> futures of that iteration's training
        self._ahead: dict[int, list[PrefectFuture]] = {}

    def submit(self, rollout_id: int, after: list[PrefectFuture]) -> None:
        self._ahead[rollout_id] = self._submit(rollout_id, after)

    def submitted(self, rollout_id: int) -> bool:
        return rollout_id in self._ahead

    def take(self, rollout_id: int) -> list[PrefectFuture]:
        """The training of `rollout_id`: submitted ahead, or now."""
        if rollout_id in self._ahead:
            return self._ahead.pop(rollout_id)
        return self._submit(rollout_id, [])
