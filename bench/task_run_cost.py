"""What one Prefect task run costs on the Ray task runner, three task bodies side by side
in one Ray session, no-op tasks submitted one after another:
- prefect-ray's own, then its logs and states sent to the API before the result returns;
- the same with Prefect's settings and API client reused per process
  (flows/prefect_on_ray/context_cache.py);
- this project's fast runner (flows/prefect_on_ray): reused, and a completed task run's logs
  and states left to the worker's running Prefect services (reporting.py there).

    python -m bench.task_run_cost [--tasks 30]

Prints the median wall time from submit to result per task run (the first 5 of each side,
which start the workers, are left out), over `--repeats` rounds of all three sides:
min / median / max of the medians.
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

from bench.common import ratio_line, spread
from flows.prefect_on_ray import FastRayTaskRunner, ensure_api_server, worker_env
from flows.prefect_on_ray.task_body import run_reused
from infra.cluster.ray_cluster import runtime_env


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


def reused_then_flush(*refs, **kwargs):
    try:
        return run_reused(*refs, **kwargs)
    finally:
        APILogHandler().flush()


class ReusedBlockingRunner(FastRayTaskRunner):
    """Settings and client reused, logs and states sent before the result returns."""

    task_body = staticmethod(reused_then_flush)


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
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    ensure_api_server()
    ray.init(num_cpus=2, include_dashboard=False, runtime_env=runtime_env("", worker_env()))
    sides = {
        "prefect_ray_ms": PlainRayTaskRunner,
        "reused_blocking_ms": ReusedBlockingRunner,
        "this_runner_ms": FastRayTaskRunner,
    }
    rounds: dict[str, list[float]] = {name: [] for name in sides}
    try:
        for _ in range(args.repeats):
            for name, runner in sides.items():
                rounds[name].append(timed(runner(), args.tasks))
            print(json.dumps({name: ms[-1] for name, ms in rounds.items()}), flush=True)
    finally:
        ray.shutdown()
    for name, ms in rounds.items():
        print(f"{name}: {spread(ms, '{:.1f}')}")
    mid = {name: statistics.median(ms) for name, ms in rounds.items()}
    print(
        ratio_line(
            "task run, prefect-ray / this runner",
            [p / t for p, t in zip(rounds["prefect_ray_ms"], rounds["this_runner_ms"], strict=True)],
            "none (diagnostic)",
        )
    )
    print(
        ratio_line(
            "task run, reports before the result / left to the running services",
            [b / t for b, t in zip(rounds["reused_blocking_ms"], rounds["this_runner_ms"], strict=True)],
            "none (diagnostic)",
        )
    )
    print(json.dumps({name: round(v, 1) for name, v in mid.items()}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
