"""Prefect task: one training iteration of the PPO value critic on every critic rank."""

from __future__ import annotations

from prefect import get_run_logger, task

from infra.handles import RunHandles
from tasks.options import RUN_ALWAYS


# No retries: an optimizer step is not idempotent.
@task(name="train-critic", task_run_name="train-critic-{rollout_id:04d}", **RUN_ALWAYS)
def train_critic(run: RunHandles, rollout_id: int) -> dict:
    metrics = run.train_critic(rollout_id)
    get_run_logger().info(
        "train critic %d: value loss %.4f, clipfrac %.3f, value mean %.3f, explained var %.3f, %.2fs",
        rollout_id,
        metrics["value_loss"],
        metrics["value_clipfrac"],
        metrics["value_mean"],
        metrics["value_explained_var"],
        metrics["time_train_critic_s"],
    )
    return metrics
