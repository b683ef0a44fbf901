"""Prefect options shared by the loop's tasks."""

from prefect.cache_policies import NO_CACHE

from infra.errors import is_deterministic

# Caching off: a call must really run; results are still persisted (flows/results.py).
RUN_ALWAYS = {"cache_policy": NO_CACHE}


def retry_transient_only(task, task_run, state) -> bool:
    """Retry a failed run unless its error is deterministic (bad input fails the same way again)."""
    exc = state.data if isinstance(state.data, BaseException) else state.result(raise_on_failure=False)
    return not (isinstance(exc, BaseException) and is_deterministic(exc))


# For steps whose work is idempotent (generate, save, sync, eval): retry transient failures,
# with growing delays so that storage or an engine has time to come back.
RETRIED = {
    **RUN_ALWAYS,
    "retries": 3,
    "retry_delay_seconds": [2, 5, 15],
    "retry_condition_fn": retry_transient_only,
}
