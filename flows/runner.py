"""A RayTaskRunner that joins the Ray cluster the flow body connected to.

The cluster address and the workers' environment come from the flow's config parameter,
which a task runner fixed at decoration time cannot see; so this runner starts no Ray
itself and the flow connects (and disconnects) through infra.system.RLSystem.
"""

from __future__ import annotations

from prefect.task_runners import TaskRunner
from prefect_ray import RayTaskRunner


class ConnectedRayTaskRunner(RayTaskRunner):
    def __enter__(self):
        TaskRunner.__enter__(self)  # skip RayTaskRunner's ray.init: the flow body connects
        return self

    def __exit__(self, *exc_info):
        TaskRunner.__exit__(self, *exc_info)

    def duplicate(self) -> ConnectedRayTaskRunner:
        return type(self)()
