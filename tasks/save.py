"""Prefect task: checkpoint the run (trainer shards, prompt state, commit marker)."""

from __future__ import annotations

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from infra.handles import RunHandles


# Idempotent: a retry of a committed save returns it; a partial one is cleaned and redone.
@task(
    name="save",
    task_run_name="save-{rollout_id:04d}",
    retries=2,
    retry_delay_seconds=2,
    cache_policy=NO_CACHE,
)
def save(run: RunHandles, rollout_id: int, export_hf: bool) -> dict:
    result = run.save(rollout_id, export_hf)
    get_run_logger().info("checkpoint %s (%.2fs)", result["checkpoint_uri"], result["time_save_s"])
    return result
