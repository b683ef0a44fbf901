"""Prefect task: one training iteration on every trainer rank."""

from __future__ import annotations

from prefect import get_run_logger, task

from infra.handles import RunHandles
from tasks.options import RUN_ALWAYS


# No retries: an optimizer step is not idempotent.
@task(name="train", task_run_name="train-{rollout_id:04d}", **RUN_ALWAYS)
def train(run: RunHandles, rollout_id: int) -> dict:
    metrics = run.train(rollout_id)
    # what became of a checkpoint written in the background: logged, not a metric
    committed, error = metrics.pop("checkpoint_committed", None), metrics.pop("checkpoint_commit_error", None)
    if committed is not None:
        get_run_logger().info("checkpoint of iteration %d written and committed", committed)
    if error is not None:
        get_run_logger().warning("background checkpoint write failed, not committed: %s", error)
    get_run_logger().info(
        "train %d: loss %.4f, grad norm %.3f, clipfrac %.3f, kl %.4f, |logp diff| %.2e, %.2fs",
        rollout_id,
        metrics["loss"],
        metrics["grad_norm"],
        metrics["pg_clipfrac"],
        metrics["kl"],
        metrics["train_engine_logprob_abs_diff"],
        metrics["time_train_s"],
    )
    return metrics
