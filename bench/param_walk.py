"""What Prefect's walks over a task run's parameters cost, with the run's handles plain and
wrapped in `opaque` (as flows/train.py passes them), side by side.

    python -m bench.param_walk [--repeats 5 --rounds 30]

A task run's parameters are walked five times: on the flow's side for the task inputs and
by prefect-ray's exchange of futures for Ray refs; on the worker by prefect-ray's resolve of
Ray refs, and by the task engine for the task inputs and to resolve the parameters. Plain,
each walk descends into RunHandles and the whole config tree in it (and the returning
walks rebuild it); `opaque` stops them at the top. The figure is CPU time (process time)
of those five walks per task run, median over rounds, for the demo config.
"""

from __future__ import annotations

import argparse
import statistics
import time

from prefect.utilities.annotations import opaque
from prefect.utilities.collections import visit_collection
from prefect.utilities.engine import collect_task_run_inputs_sync

from bench.common import ratio_line, spread
from infra.config import RunConfig
from infra.handles import RunHandles


def _same(expr: object) -> object:
    return expr


def task_run_walks(run: object) -> None:
    """The five walks of one task run's parameters (as Prefect 3.9 and prefect-ray 0.6 do them)."""
    params = {"run": run, "rollout_id": 3}
    collect_task_run_inputs_sync(params)  # flow: the task run's inputs
    visit_collection(params, visit_fn=_same, return_data=True)  # flow: prefect-ray's exchange
    visit_collection(params, visit_fn=_same, return_data=True)  # worker: prefect-ray's resolve
    collect_task_run_inputs_sync(params)  # worker: the engine's task inputs
    visit_collection(params, visit_fn=_same, return_data=True, remove_annotations=True)  # worker


def cpu_ms(run: object, rounds: int) -> float:
    times = []
    for _ in range(rounds):
        t0 = time.process_time()
        task_run_walks(run)
        times.append(time.process_time() - t0)
    return statistics.median(times) * 1000


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=30)
    args = ap.parse_args()
    run = RunHandles(
        cfg=RunConfig(), manager=None, trainers=[None, None], run_uri="runs/x",
        model_uri="runs/x/base_model", transport=None,
    )  # fmt: skip
    plain, wrapped = [], []
    for _ in range(args.repeats):  # alternating, so both sides see the same machine
        plain.append(cpu_ms(run, args.rounds))
        wrapped.append(cpu_ms(opaque(run), args.rounds))
    print("demo config's RunHandles; CPU ms of one task run's five parameter walks")
    print(f"plain  ms: {spread(plain)}")
    print(f"opaque ms: {spread(wrapped)}")
    ratios = [p / w for p, w in zip(plain, wrapped, strict=True)]
    print(ratio_line("task run parameter walks, plain / opaque handles, CPU", ratios, "none (diagnostic)"))


if __name__ == "__main__":
    main()
