"""Which task runner the flow runs on: the fast one, or prefect-ray's own, unchanged."""

from __future__ import annotations

import os

from prefect.task_runners import TaskRunner
from prefect_ray import RayTaskRunner

from flows.prefect_on_ray.runner import FastRayTaskRunner

TASK_RUNNER_ENV = "PRL_TASK_RUNNER"
KINDS = ("fast", "stock")


def task_runner(kind: str | None = None) -> TaskRunner:
    """The runner named by `kind`, by default by the environment variable PRL_TASK_RUNNER:
    `fast` (the default) or `stock`.

    The stock RayTaskRunner joins the Ray this process is connected to when the flow run
    starts (its `__enter__` starts none then, whatever its address): `python -m flows.train`
    connects the run's cluster first (infra.cluster.ray_cluster.ray_session). With nothing
    connected, as in a flow run that a deployment starts, it does what prefect-ray does: joins
    the cluster at RAY_ADDRESS or starts a local Ray of its own, which the run then uses."""
    kind = kind or os.environ.get(TASK_RUNNER_ENV) or "fast"
    if kind == "fast":
        return FastRayTaskRunner()
    if kind == "stock":
        return RayTaskRunner()
    raise ValueError(f"{TASK_RUNNER_ENV}={kind!r}: the task runner is one of {', '.join(KINDS)}")
