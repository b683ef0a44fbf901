"""Prefect task: evaluate the engines' current weights on held-out prompts."""

from __future__ import annotations

from prefect import get_run_logger, task

from infra.handles import RunHandles
from infra.stage_handles import EvalHandles
from tasks.options import RETRIED


# The RL loop's evals, and the pipeline's eval stages (EvalHandles: engines and manager only).
@task(name="eval", task_run_name="eval-{rollout_id:04d}", **RETRIED)
def evaluate(run: RunHandles | EvalHandles, rollout_id: int) -> dict:
    result = run.evaluate(rollout_id)
    passes = ", ".join(f"{k} {v:.3f}" for k, v in result.items() if k.startswith("eval_pass@"))
    get_run_logger().info("eval %d: reward %.3f, %s", rollout_id, result["eval_reward_mean"], passes)
    return result
