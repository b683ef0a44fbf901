"""What one Prefect task run costs on the Ray task runner: prefect-ray's own task body
against this project's runner (flows/runner.py), which reuses Prefect's settings and API
client per process. Both in one Ray session, no-op tasks submitted one after another.

    python -m bench.task_run_cost [--tasks 30]

Prints the median wall time from submit to result per task run (the first 5 of each side,
which start the workers, are left out). prefect-ray's side runs first: the runner's flow-side
settings cache, once installed, stays for the process.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import ray
from prefect import flow, task
from prefect.logging.handlers import APILogHandler
from prefect.task_runners import TaskRunner
from prefect_ray import RayTaskRunner
from prefect_ray.context import remote_options

from flows.prefect_api import ensure_api_server, worker_env
from flows.runner import ConnectedRayTaskRunner


class PlainRayTaskRunner(RayTaskRunner):
    """prefect-ray's task body with the same log flush, joined to the running Ray session."""

    def __enter__(self):
        TaskRunner.__enter__(self)
        return self

    def __exit__(self, *exc_info):
        TaskRunner.__exit__(self, *exc_info)

    def duplicate(self) -> PlainRayTaskRunner:
        return type(self)()

    @staticmethod
    def _run_prefect_task(*refs, **kwargs):
        try:
            return RayTaskRunner._run_prefect_task(*refs, **kwargs)
        finally:
            APILogHandler().flush()


@task(name="noop", task_run_name="noop-{i:04d}")
def noop(i: int) -> int:
    return i


def timed(runner: TaskRunner, n: int) -> float:
    @flow(name=f"task-run-cost-{type(runner).__name__}", task_runner=runner)
    def many() -> list[float]:
        times = []
        with remote_options(num_cpus=0):
            for i in range(n):
                t0 = time.perf_counter()
                noop.submit(i).result()
                times.append(time.perf_counter() - t0)
        return times

    return round(1000 * statistics.median(many()[5:]), 1)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.task_run_cost", description=__doc__.split("\n")[0])
    parser.add_argument("--tasks", type=int, default=30)
    args = parser.parse_args(argv)
    ensure_api_server()
    ray.init(num_cpus=2, include_dashboard=False, runtime_env={"env_vars": worker_env()})
    try:
        plain = timed(PlainRayTaskRunner(), args.tasks)
        reused = timed(ConnectedRayTaskRunner(), args.tasks)
    finally:
        ray.shutdown()
    print(json.dumps({"prefect_ray_ms": plain, "this_runner_ms": reused, "ratio": round(plain / reused, 2)}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
