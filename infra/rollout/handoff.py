"""What the actor and the critic hand each other per rollout, through the rollout manager:
the critic's values (the actor's advantages need them) and, with the KL in the reward, the
actor's per-token KL (the critic's returns need it). Each group waits for what it needs,
so neither the flow nor its tasks carry the data, and both groups train at once.

It also counts who still uses a rollout's batch: the batch is dropped only when every
consumer of that iteration (the actor, the critic) is done with it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable


class Handoff:
    def __init__(self, consumers: Callable[[int], set[str]]):
        self._consumers = consumers
        self._posts: dict[tuple[int, str], object] = {}
        self._done: dict[int, set[str]] = {}
        self._cond = threading.Condition()

    def post(self, rollout_id: int, key: str, value: object) -> None:
        with self._cond:
            self._posts[(rollout_id, key)] = value
            self._cond.notify_all()

    def wait(self, rollout_id: int, key: str, timeout_s: float) -> object:
        """The value posted under `key` for `rollout_id`, once it is there."""
        with self._cond:
            if not self._cond.wait_for(lambda: (rollout_id, key) in self._posts, timeout=timeout_s):
                raise TimeoutError(
                    f"rollout {rollout_id}: no {key} posted within {timeout_s:.0f}s "
                    "(cluster.collective_timeout_s); did the other trainer group fail?"
                )
            return self._posts[(rollout_id, key)]

    def done(self, rollout_id: int, consumer: str) -> bool:
        """Mark `consumer` done with the rollout; True once all its consumers are (its posts go)."""
        with self._cond:
            done = self._done.setdefault(rollout_id, set())
            done.add(consumer)
            if not done >= self._consumers(rollout_id):
                return False
            del self._done[rollout_id]
            for key in [k for k in self._posts if k[0] == rollout_id]:
                del self._posts[key]
            return True
