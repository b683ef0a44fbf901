"""A RayTaskRunner that joins the Ray cluster the flow body connected to.

The cluster address and the workers' environment come from the flow's config parameter,
which a task runner fixed at decoration time cannot see; so this runner starts no Ray
itself and the flow connects (and disconnects) through infra.system.RLSystem.
"""

from __future__ import annotations

from prefect.task_runners import TaskRunner
from prefect_ray import RayTaskRunner

from flows.context_cache import reused_prefect_context, serialize_settings_once
from flows.worker_logs import flush_task_logs


class ConnectedRayTaskRunner(RayTaskRunner):
    def __enter__(self):
        TaskRunner.__enter__(self)  # skip RayTaskRunner's ray.init: the flow body connects
        serialize_settings_once()
        return self

    def __exit__(self, *exc_info):
        TaskRunner.__exit__(self, *exc_info)

    def duplicate(self) -> ConnectedRayTaskRunner:
        return type(self)()

    @staticmethod
    def _run_prefect_task(*upstream_ray_obj_refs, context: dict, **kwargs):
        """prefect-ray's task body in the worker's reused settings and API client
        (flows/context_cache.py), then the task run's logs sent before the result returns.

        A Ray worker sends logs to the API from a background batch every few seconds; the
        workers are killed at ray.shutdown, so without this a run's last task logs (and a
        fast task's all) could be lost and the task run page would show none.
        """
        try:
            with reused_prefect_context(context) as reused:
                return RayTaskRunner._run_prefect_task(*upstream_ray_obj_refs, context=reused, **kwargs)
        finally:
            flush_task_logs()  # not APILogHandler().flush() alone: see flows/worker_logs.py
