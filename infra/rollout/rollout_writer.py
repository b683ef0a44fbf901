"""Rollout files written beside the loop instead of on its critical path.

An iteration's parquet file (infra/rollout/rollout_files.py) is written after its last
answer is scored, and the flow submits the weight sync only once generate returns: at 32
engines x 8k samples that write put 0.17-0.27 s on every iteration (bench.scale_sweep). So
the rollout manager hands the samples to this writer and returns; the file is written while
the weights sync and the next iteration trains.

Whoever needs the files on storage calls `flush()`: a checkpoint (it names the batch generated
ahead, which a resume reads back from its file), the next generate (so one write at most is
in flight, and its failure fails a task that Prefect retries), and the run's end. A write that
failed in the background is made again by `flush`, from the samples the writer keeps until
their file is written; if it fails again, `flush` raises that error.
"""

from __future__ import annotations

import threading
from concurrent.futures import Future, ThreadPoolExecutor

from infra.rollout.batch import Sample
from infra.rollout.rollout_files import rollout_rel, write_rollout
from infra.storage.fs import RunStore


class RolloutWriter:
    def __init__(self, store: RunStore) -> None:
        self.store = store
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="rollout-writer")
        self._lock = threading.Lock()
        # rollout id -> (its write, what to write again if that fails)
        self._pending: dict[int, tuple[Future, list[Sample], dict]] = {}

    def submit(self, rollout_id: int, samples: list[Sample], stats: dict) -> str:
        """Write rollout `rollout_id`'s file in the background; the URI it will have."""
        stats = dict(stats)  # as it is now: the caller may add keys that are not the file's
        future = self._pool.submit(write_rollout, self.store, rollout_id, samples, stats)
        with self._lock:
            self._pending[rollout_id] = (future, samples, stats)
        return self.store.uri(rollout_rel(rollout_id))

    def pending(self) -> list[int]:
        """The rollouts whose file is not known to be written yet."""
        with self._lock:
            return sorted(self._pending)

    def flush(self) -> None:
        """Return once every file submitted so far is written; raises a write's error if it
        fails once more here."""
        with self._lock:
            pending = sorted(self._pending.items())
        for rollout_id, (future, samples, stats) in pending:
            if future.exception() is not None:  # waits for the write
                write_rollout(self.store, rollout_id, samples, stats)
            with self._lock:
                if rollout_id in self._pending and self._pending[rollout_id][0] is future:
                    del self._pending[rollout_id]
