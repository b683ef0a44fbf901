"""Prefect task: push the trainer's weights to the rollout engines."""

from __future__ import annotations

from prefect import get_run_logger, task

from infra.handles import RunHandles
from tasks.options import RETRIED


# Idempotent: sending the same weights with the same version twice changes nothing.
@task(name="sync", task_run_name="sync-{weight_version:04d}", **RETRIED)
def sync(run: RunHandles, weight_version: int) -> dict:
    result = run.sync(weight_version)
    checked = (
        f", {result['weights_checked']} tensors checked (max abs diff {result['max_abs_diff']:.3g})"
        if "weights_checked" in result
        else ""
    )
    get_run_logger().info(
        "engines at weight version %d in %.2fs%s", weight_version, result["time_sync_s"], checked
    )
    return result
