"""Prefect on Ray, made fast for the RL loop; and the run's own Prefect API server.

The flow's task runs are short control steps (each blocks on actors for a few ms of work),
a dozen an iteration, so what Prefect and prefect-ray spend on each one sets the loop's
pace on a small machine. The fast runner (`FastRayTaskRunner`) submits them as prefect-ray's
RayTaskRunner does, with the per-task-run work done once instead: the remote function,
Prefect's serialized context, settings and API client, the run's handles (runner.py,
task_body.py, context_cache.py, object_store.py), and with task runs' reports left to
Prefect's background services (reporting.py). The API server (api_server.py) is the one
Prefect runs for itself, started beside Ray instead of before it.

Some of this rests on what Prefect does not promise (its private modules and attributes, how
it reads its own environment); each such assumption has a test in
tests/unit/test_prefect_seams.py that names it, its user here and the versions it was
checked on. Nothing is patched at import, and nothing of Prefect's is replaced: the fast
runner uses these only inside its own submit and task body.

PRL_TASK_RUNNER (environment variable, read when flows.train is imported): `fast` (the
default) or `stock`, prefect-ray's RayTaskRunner as it is, none of the above in the task runs:
the same flow, to compare with or to rule this package out. Stock joins the Ray the process
is connected to when the flow run starts (`python -m flows.train` connects the run's cluster
first); task runs still go to the control workers' remote options, but as plain Ray tasks.
"""

from flows.prefect_on_ray.api_server import ApiServerStart, ensure_api_server, worker_env
from flows.prefect_on_ray.reporting import wait_reported
from flows.prefect_on_ray.runner import FastRayTaskRunner, for_every_task_run, task_runs_reported
from flows.prefect_on_ray.switch import TASK_RUNNER_ENV, task_runner

__all__ = [
    "TASK_RUNNER_ENV",
    "ApiServerStart",
    "FastRayTaskRunner",
    "ensure_api_server",
    "for_every_task_run",
    "task_runner",
    "task_runs_reported",
    "wait_reported",
    "worker_env",
]
