"""Prefect task: checkpoint the run (trainer shards, prompt state, commit marker)."""

from __future__ import annotations

from prefect import get_run_logger, task

from infra.handles import RunHandles
from tasks.options import RETRIED


# Idempotent: a retry of a committed save returns it; a partial one is cleaned and redone.
# In the background the ranks write while the next iterations run; the next train or save
# task commits it (the last save of a flow run does not go to the background).
@task(name="save", task_run_name="save-{rollout_id:04d}", **RETRIED)
def save(run: RunHandles, rollout_id: int, export_hf: bool, background: bool = False) -> dict:
    result = run.save(rollout_id, export_hf, background)
    state = "committed" if result.get("checkpoint_committed", True) else "writing in the background"
    get_run_logger().info("checkpoint %s %s (%.2fs)", result["checkpoint_uri"], state, result["time_save_s"])
    return result
