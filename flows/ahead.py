"""Task runs submitted ahead of the iteration that needs them: the generate one iteration
ahead with the batch it produced, and, behind this iteration's weight sync, the next
iteration's training and the generate after it.

The seed's loop keeps one `next` future: wait it for this iteration's data, submit the next
generate, and wait it again before a weight sync (no generation in flight while weights
change) or a save (the batch generated ahead is part of the checkpoint). `GenerateAhead` is
that bookkeeping, so the flow reads like the loop; a generate submitted behind a sync waits
for it in Ray instead of in the flow (it starts as the sync ends, not once the flow has read
the sync's result and submitted it).
"""

from __future__ import annotations

from collections.abc import Callable

from prefect.futures import PrefectFuture


class GenerateAhead:
    def __init__(self, submit: Callable[[int, list[PrefectFuture]], PrefectFuture]) -> None:
        self._submit = submit  # (rollout_id, wait_for) -> future of the generate task run
        self._futures: dict[int, PrefectFuture] = {}  # submitted, not yet drained
        self._ready: dict[int, dict] = {}  # batches drained but not yet taken
        self._last: list[PrefectFuture] = []  # the previous generate: runs reach the actor in order

    def submit(self, rollout_id: int, after: list[PrefectFuture] | None = None) -> None:
        """Generate batch `rollout_id` once the previous generate and `after` are done; a
        batch already submitted is not submitted again."""
        if rollout_id in self._futures or rollout_id in self._ready:
            return
        future = self._submit(rollout_id, self._last + (after or []))
        self._futures[rollout_id], self._last = future, [future]

    def in_flight(self) -> list[PrefectFuture]:
        """The generate task runs in flight (for a task run that must start after them)."""
        return list(self._futures.values())

    def drain(self) -> None:
        """Wait the generation in flight, if any; its batches are kept for `take`."""
        for rollout_id in sorted(self._futures):
            self._ready[rollout_id] = self._futures.pop(rollout_id).result()

    def take(self, rollout_id: int) -> dict:
        """The summary of batch `rollout_id`, generating it now if nothing is ahead."""
        self.submit(rollout_id)
        if rollout_id in self._futures:
            self._ready[rollout_id] = self._futures.pop(rollout_id).result()
        return self._ready.pop(rollout_id)


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
