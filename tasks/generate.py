"""Prefect task: roll out one iteration's prompts on the engines."""

from __future__ import annotations

from prefect import get_run_logger, task

from infra.handles import RunHandles
from tasks.options import RETRIED


# Idempotent: prompts and sampling seeds are pure functions of rollout_id.
@task(name="generate", task_run_name="generate-{rollout_id:04d}", **RETRIED)
def generate(run: RunHandles, rollout_id: int) -> dict:
    summary = run.generate(rollout_id)
    if summary.get("engine_restarts"):
        get_run_logger().warning(
            "rollout %d: %d engine(s) failed and were restarted with their weights; their requests ran again",
            rollout_id,
            summary["engine_restarts"],
        )
    get_run_logger().info(
        "rollout %d: %d samples, reward %.3f, weight version %d, %.2fs",
        rollout_id,
        summary["num_samples"],
        summary["reward_mean"],
        summary["weight_version"],
        summary["time_generate_s"],
    )
    return summary
