"""A chain of task runs, each waiting for the one before (as the loop's train k -> sync ->
train k+1), on this project's runner: as Ray tasks against on the run's control workers
(infra/cluster/control_workers.py), side by side in one Ray session.

    python -m bench.task_run_chain [--links 40 --repeats 5]

Each side's flow submits `--links` no-op task runs, each with `wait_for` the one before,
then waits for the last; a link's cost is that wall time over the links (the flow submits
them all at once, so it is what each task run and each hand-over between two of them
costs). As Ray tasks, Ray starts a task run once its upstream's result is back in the
flow's process, on a worker leased from the raylet; on a control worker, it is queued
behind its upstream and starts when the worker is done with it. The sides alternate which
goes first, and each runs one chain untimed first (workers and the API warm).
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import ray
from prefect import flow, task
from prefect_ray.context import remote_options

from bench.common import ratio_line, spread
from flows.prefect_on_ray import FastRayTaskRunner, ensure_api_server, task_runs_reported, worker_env
from infra.cluster.control_workers import CONTROL_OPTIONS, close_pool, open_pool
from infra.cluster.ray_cluster import runtime_env

WORKER_IMPORTS = ["prefect.task_engine", "prefect.client.orchestration", "prefect_ray.task_runners"]


@task(name="link", task_run_name="link-{i:04d}")
def link(i: int) -> int:
    return i


@flow(name="task-run-chain", task_runner=FastRayTaskRunner())
def chain(links: int) -> float:
    with task_runs_reported(), remote_options(**CONTROL_OPTIONS):
        t0 = time.perf_counter()
        future = link.submit(0)
        for i in range(1, links):
            future = link.submit(i, wait_for=[future])
        future.result()
        return (time.perf_counter() - t0) / links


def side(on_control_workers: bool, links: int) -> float:
    """ms per link of one chain, after an untimed one (workers and the API warm)."""
    pool = None
    if on_control_workers:
        pool, ready = open_pool(WORKER_IMPORTS, 2)
        ray.get(ready)
    try:
        chain(links)
        return 1000 * chain(links)
    finally:
        if pool is not None:
            close_pool(pool)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.task_run_chain", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--links", type=int, default=40)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    ensure_api_server()
    ray.init(num_cpus=2, include_dashboard=False, runtime_env=runtime_env("", worker_env()))
    ms: dict[str, list[float]] = {"ray_tasks": [], "control_workers": []}
    try:
        for r in range(args.repeats):
            order = ["ray_tasks", "control_workers"] if r % 2 == 0 else ["control_workers", "ray_tasks"]
            for name in order:
                ms[name].append(round(side(name == "control_workers", args.links), 2))
            print(json.dumps({name: v[-1] for name, v in ms.items()}), flush=True)
    finally:
        ray.shutdown()
    print(f"{args.links} chained no-op task runs per chain, {args.repeats} chains a side")
    for name, values in ms.items():
        print(f"{name} ms per link: {spread(values, '{:.1f}')}")
    print(
        ratio_line(
            "chained task run, Ray tasks / control workers, ms per link",
            [a / b for a, b in zip(ms["ray_tasks"], ms["control_workers"], strict=True)],
            "none (diagnostic)",
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
