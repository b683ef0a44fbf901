"""Prefect task: checkpoint the run (trainer shards, prompt state, commit marker)."""

from __future__ import annotations

from prefect import get_run_logger, task

from infra.handles import RunHandles
from tasks.options import RETRIED


# Idempotent: a retry of a committed save returns it; a partial one is cleaned and redone.
@task(name="save", task_run_name="save-{rollout_id:04d}", **RETRIED)
def save(run: RunHandles, rollout_id: int, export_hf: bool) -> dict:
    result = run.save(rollout_id, export_hf)
    get_run_logger().info("checkpoint %s (%.2fs)", result["checkpoint_uri"], result["time_save_s"])
    return result
