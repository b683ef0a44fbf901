"""Prefect task: evaluate the engines' current weights on held-out prompts."""

from __future__ import annotations

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from infra.handles import RunHandles


@task(
    name="eval",
    task_run_name="eval-{rollout_id:04d}",
    retries=2,
    retry_delay_seconds=2,
    cache_policy=NO_CACHE,
)
def evaluate(run: RunHandles, rollout_id: int) -> dict:
    result = run.evaluate(rollout_id)
    passes = ", ".join(f"{k} {v:.3f}" for k, v in result.items() if k.startswith("eval_pass@"))
    get_run_logger().info("eval %d: reward %.3f, %s", rollout_id, result["eval_reward_mean"], passes)
    return result
