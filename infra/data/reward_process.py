"""Plug-in rewards run in worker processes, so that a call past its time limit is stopped.

Python cannot stop a thread: a reward that hangs in one keeps running, holding its thread,
its memory and a CPU, until the run ends, and every timed-out call adds one more. A process
can be killed: pebble's pool kills the worker whose call runs past its timeout and starts a
fresh one. A reward that crashes its process (a segfault in a native grader, `os._exit`)
fails only its samples too.

The workers are spawned (the caller is a Ray actor with threads, where fork is unsafe) and
resolve the plug-in from its spec themselves, so nothing but the spec and the call's
arguments crosses the process boundary. Each worker holds its own copy of the plug-in's
module state.
"""

from __future__ import annotations

import concurrent.futures
import functools
import multiprocessing
import threading
from collections.abc import Callable, Sequence

from infra.data.group_rewards import RewardTimeoutError

_pool = None
_pool_size = 0
_pool_lock = threading.Lock()
_loaded: dict[str, Callable] = {}


def _call_in_worker(spec: str, args: tuple, kw: dict) -> object:
    fn = _loaded.get(spec)
    if fn is None:
        from infra.data.rewards import load_callable  # noqa: PLC0415 - imported in the worker only

        fn = _loaded[spec] = load_callable(spec, "reward")
    return fn(*args, **kw)


def _shared_pool(workers: int):
    """The process's worker pool, started on first use (a run's rewards share it)."""
    global _pool, _pool_size
    with _pool_lock:
        if _pool is None or not _pool.active or _pool_size != workers:
            from pebble import ProcessPool  # noqa: PLC0415 - only runs with a plug-in reward need it

            if _pool is not None:
                _pool.stop()
            _pool = ProcessPool(max_workers=workers, context=multiprocessing.get_context("spawn"))
            _pool_size = workers
        return _pool


def stop_workers() -> None:
    """Stop the worker processes (a later call starts new ones)."""
    global _pool
    with _pool_lock:
        if _pool is not None:
            _pool.stop()
            _pool.join()
            _pool = None


class ProcessReward:
    """A plug-in reward (`module:function` or `file.py:function`) called in a worker process,
    each call within `timeout_s`. It keeps the function's name and reward scope."""

    # the caller need not time the calls (and must not: a call queued behind busy workers
    # has not started its clock yet)
    enforces_timeout = True

    def __init__(self, spec: str, fn: Callable, timeout_s: float, workers: int) -> None:
        functools.update_wrapper(self, fn)  # __module__, __qualname__, reward_scope
        self.spec, self.timeout_s, self.workers = spec, timeout_s, workers

    def __call__(self, *args, **kw) -> object:
        value = self.call_many([args], kw)[0]
        if isinstance(value, BaseException):
            raise value
        return value

    def call_many(self, calls: Sequence[tuple], kw: dict) -> list[object]:
        """One call per argument tuple, run on the pool's workers; each value is the call's
        result or the exception that failed it."""
        pool = _shared_pool(self.workers)
        futures = [
            pool.schedule(_call_in_worker, args=(self.spec, tuple(args), kw), timeout=self.timeout_s)
            for args in calls
        ]
        return [self._outcome(f) for f in futures]

    def _outcome(self, future: concurrent.futures.Future) -> object:
        from pebble import ProcessExpired  # noqa: PLC0415

        try:
            return future.result()
        except concurrent.futures.TimeoutError:
            return RewardTimeoutError(
                f"reward call exceeded data.reward_timeout_s={self.timeout_s:g}; its worker process was stopped"
            )
        except ProcessExpired as e:
            return RuntimeError(f"reward {self.spec} ended its worker process (exit code {e.exitcode})")
        except Exception as e:  # the reward's own error, raised in the worker
            return e
