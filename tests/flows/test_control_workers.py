"""The run's control workers (infra/cluster/control_workers.py) with a real local Ray, and the
flow's task runs on them through the fast runner (flows/prefect_on_ray) with a real Prefect API.

A chain (work that waits for the last thing sent to a worker) queues behind it on that
worker and is not handed to Ray as an argument: ordering alone makes it wait. Everything
else goes to an idle worker, or a new one when none is idle.
"""

from __future__ import annotations

import asyncio
import gc
import os
import signal
import time
from uuid import uuid4

import pytest
import ray
from prefect import flow, task
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import TaskRunFilter, TaskRunFilterId
from prefect_ray.context import remote_options

from flows.prefect_on_ray.runner import FastRayTaskRunner, task_runs_reported
from flows.prefect_on_ray.task_body import finished_here
from infra.cluster.control_workers import (
    CONTROL_OPTIONS,
    RECENT_PER_WORKER,
    ControlWorkers,
    close_pool,
    current_pool,
    open_pool,
)
from tests.processes import alive

pytestmark = pytest.mark.flow


def stamp(seconds: float) -> tuple[int, float, float]:
    """(pid, start, end) of a call that sleeps `seconds` on a control worker."""
    start = time.time()
    time.sleep(seconds)
    return os.getpid(), start, time.time()


@pytest.fixture
def pool(prefect_log_batches):
    pool = ControlWorkers([], options={"num_cpus": 0})
    ray.get(pool.start(2))
    yield pool
    pool.close()


def test_a_chain_waits_on_its_worker_by_order_alone_and_other_work_goes_beside_it(pool):
    first_worker, local = pool.pick([])
    assert local == []
    first = pool.send(first_worker, stamp, 1.0)
    # waits for the worker's last: behind it, and nothing for Ray to wait for
    worker, local = pool.pick([first])
    assert worker is first_worker and local == [first]
    second = pool.send(worker, stamp, 0.0)
    # waits for nothing: the other worker, not behind the chain
    other, local = pool.pick([])
    assert other is not first_worker and local == []
    beside = pool.send(other, stamp, 0.0)
    (pid1, _, end1), (pid2, start2, _), (pid3, start3, _) = ray.get([first, second, beside])
    assert pid1 == pid2 != pid3
    assert start2 >= end1  # ordering held it until its upstream ended
    assert start3 < end1  # and the other work ran meanwhile


def test_a_ref_that_is_no_workers_last_is_left_to_ray_and_busy_workers_get_company(pool):
    a = pool.send(pool.pick([])[0], stamp, 1.0)
    b = pool.send(pool.pick([])[0], stamp, 1.0)
    behind_a = pool.send(pool.pick([a])[0], stamp, 0.0)
    # a is no longer its worker's last: work that waits for it must not queue behind behind_a
    # by accident of choice; both workers are busy, so a third one starts
    worker, local = pool.pick([a])
    assert len(pool.workers) == 3 and local == []
    third = pool.send(worker, stamp, 0.0)
    # what waits for refs on two workers goes behind the first of them that is a worker's last
    worker, local = pool.pick([b, behind_a])
    assert local == [b] and worker.last == b
    pids = {ray.get(r)[0] for r in (a, b, behind_a, third)}
    assert len(pids) == 3


def test_work_sent_to_a_worker_long_before_is_left_to_ray_to_wait_for(pool):
    # the worker keeps the final states of as many task runs as the pool counts as ran before
    worker, _ = pool.pick([])
    refs = [pool.send(worker, stamp, 0.0) for _ in range(RECENT_PER_WORKER + 1)]
    ray.get(refs)
    chosen, local = pool.pick([refs[0], refs[-1]])
    assert chosen is worker and local == [refs[-1]]


def test_a_worker_that_dies_fails_what_was_queued_on_it_without_running_it_again(pool):
    worker, _ = pool.pick([])
    pid = ray.get(worker.handle.pid.remote())
    running = pool.send(worker, stamp, 30.0)
    queued = pool.send(pool.pick([running])[0], stamp, 0.0)
    time.sleep(1.0)  # running is in its sleep
    os.kill(pid, signal.SIGKILL)
    for ref in (running, queued):
        with pytest.raises(ray.exceptions.RayActorError):
            ray.get(ref, timeout=60)
    with pytest.raises(ray.exceptions.RayActorError):  # not restarted either
        ray.get(worker.handle.pid.remote(), timeout=60)


def test_close_stops_the_workers(pool):
    pids = [ray.get(w.handle.pid.remote()) for w in pool.workers]
    assert len(pids) == 2
    pool.close()
    assert pool.workers == []
    deadline = time.monotonic() + 30
    while any(alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not any(alive(pid) for pid in pids)


@task(name="slow-pid")
def slow_pid() -> tuple[int, float]:
    time.sleep(2.0)
    return os.getpid(), time.time()


@task(name="pid")
def pid() -> tuple[int, float]:
    return os.getpid(), time.time()


@task(name="fails", retries=0)
def fails() -> None:
    raise ValueError("broken on purpose")


@flow(task_runner=FastRayTaskRunner())
def chain_and_beside() -> dict:
    with task_runs_reported(), remote_options(**CONTROL_OPTIONS):
        first = slow_pid.submit()
        second = pid.submit(wait_for=[first])
        third = pid.submit(wait_for=[second])  # as train k -> sync -> train k+1
        beside = pid.submit()  # as generate k+1
        failed = fails.submit()
        after_failed = pid.submit(wait_for=[failed])  # behind it on the same worker
        after_failed.wait()
        return {
            "ids": [str(f.task_run_id) for f in (first, second, third)],
            "chain": [first.result(), second.result(), third.result()],
            "beside": beside.result(),
            "after_failed": after_failed.state.name,
        }


@flow(task_runner=FastRayTaskRunner())
def with_other_options() -> int:
    with task_runs_reported(), remote_options(num_cpus=0):  # not the control workers' options
        return pid.submit().result()[0]


async def _runs(ids: list[str]) -> dict:
    async with get_client() as client:
        runs = await client.read_task_runs(task_run_filter=TaskRunFilter(id=TaskRunFilterId(any_=ids)))
        states = {str(r.id): await client.read_task_run_states(r.id) for r in runs}
        return {str(r.id): (r, states[str(r.id)]) for r in runs}


def test_the_flows_task_runs_chain_on_a_control_worker(prefect_log_batches):
    pool, ready = open_pool(["prefect.task_engine"], 2)
    try:
        worker_pids = set(ray.get(ready))
        seen = chain_and_beside()
        elsewhere = with_other_options()
    finally:
        close_pool(pool)
    assert current_pool() is None
    (pid1, end1), (pid2, _), (pid3, _) = seen["chain"]
    assert pid1 == pid2 == pid3 and pid1 in worker_pids
    beside_pid, beside_end = seen["beside"]
    assert beside_pid in worker_pids and beside_pid != pid1 and beside_end < end1
    assert seen["after_failed"] == "NotReady"  # a failed upstream on the same worker still stops it
    assert elsewhere not in worker_pids  # other options: a plain Ray task, as before
    first, second, third = seen["ids"]
    runs = asyncio.run(_runs(seen["ids"]))
    # the UI's edges, and each downstream came to be after its upstream completed
    for upstream, downstream in ((first, second), (second, third)):
        run, states = runs[downstream]
        assert [str(i.id) for i in run.task_inputs["wait_for"]] == [upstream]
        upstream_done = next(s.timestamp for s in runs[upstream][1] if s.type.value == "COMPLETED")
        assert states[0].timestamp >= upstream_done and states[-1].type.value == "COMPLETED"


def test_an_upstream_that_left_no_state_on_the_worker_counts_as_failed():
    missing = uuid4()
    state = finished_here(missing)
    assert state.is_failed() and state.state_details.task_run_id == missing
    assert str(missing) in state.message


def test_a_worker_freezes_its_start_up_heap_out_of_the_collectors_walks(pool):
    worker, _ = pool.pick([])
    # Prefect, Ray and the code's modules: frozen once the worker's imports are done
    assert ray.get(pool.send(worker, gc.get_freeze_count)) > 10_000
