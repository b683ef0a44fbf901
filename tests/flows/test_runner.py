"""The fast runner (flows/prefect_on_ray) on a real local Ray and Prefect API: its task body
must really be what Ray runs, and the settings it reuses per process (context_cache.py) must
follow the flow's settings.

The task body (`FastRayTaskRunner.task_body`) sends a failed task run's logs and states to the
API before its result; a completed one's go with the worker's next log batch, and the flow
waits for them before Ray goes down (reporting.py). The runner's submit makes one Ray remote
function of that body for all task runs. The workers of the failure test batch logs to the API
only once a minute, so the lines can only arrive through the body. What the package assumes of
Prefect's internals is checked in tests/unit/test_prefect_seams.py.
"""

from __future__ import annotations

import asyncio
import os
import pickle
import time
from dataclasses import dataclass, field
from uuid import uuid4

import pytest
import ray
from prefect import flow, get_run_logger, task
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import LogFilter, LogFilterTaskRunId, TaskRunFilter, TaskRunFilterId
from prefect.context import FlowRunContext, SettingsContext, tags
from prefect.settings import PREFECT_TASK_DEFAULT_RETRIES, temporary_settings
from prefect.states import Failed
from prefect.utilities.annotations import opaque
from prefect_ray.context import remote_options

from flows.prefect_on_ray import context_cache
from flows.prefect_on_ray.api_server import SERVER_NICENESS
from flows.prefect_on_ray.reporting import wait_reported
from flows.prefect_on_ray.runner import FastRayTaskRunner, task_runs_reported

pytestmark = pytest.mark.flow
MARK = "written-on-a-ray-worker"


@task(name="speak")
def speak() -> int:
    get_run_logger().info(MARK)
    return 7


@task(name="retries-setting")
def retries_setting() -> tuple[int, str]:
    # what the worker's task run sees, and which API client it talks through
    from prefect.client.orchestration import get_client

    return PREFECT_TASK_DEFAULT_RETRIES.value(), str(get_client(sync_client=True).api_url)


@task(name="fail", retries=0)
def fail() -> None:
    get_run_logger().info(MARK)
    raise ValueError("broken on purpose")


@dataclass
class Handles:  # as infra.handles.RunHandles: a dataclass with a tree inside
    config: dict = field(default_factory=lambda: {"rollout": {"n": 16}})
    unpickled = 0  # (not a field) how often this process has unpickled one

    def __setstate__(self, state: dict) -> None:
        type(self).unpickled += 1
        self.__dict__.update(state)


@task(name="opaque-parameter")
def opaque_parameter(handles: Handles) -> tuple[str, int, int, int]:
    import os

    return type(handles).__name__, handles.config["rollout"]["n"], os.getpid(), type(handles).unpickled


@task(name="worker-niceness")
def worker_niceness() -> int:
    import os

    return os.getpriority(os.PRIO_PROCESS, 0)


@task(name="held-services")
def held_services() -> tuple[int, int, int]:
    # what a worker keeps after its task runs: Prefect queue services alive, exit hooks held
    import gc
    import os
    import threading

    from prefect._internal.concurrency.services import _QueueServiceBase

    gc.collect()
    alive = sum(isinstance(o, _QueueServiceBase) for o in gc.get_objects())
    return os.getpid(), alive, len(threading._threading_atexits)


@task(name="flow-run-seen")
def flow_run_seen() -> tuple[str, str, int, list[str]]:
    # the flow run context a task run sees on its worker, and what the worker keeps of it
    import os

    from flows.prefect_on_ray import context_cache

    ctx = FlowRunContext.get()
    return str(ctx.flow_run.id), ctx.flow.name, os.getpid(), list(context_cache._loaded.loaded)


@flow(task_runner=FastRayTaskRunner())
def one_task() -> tuple[int, str, list, list]:
    with task_runs_reported():  # as flows/run_start.py: before Ray goes down
        seen = [retries_setting.submit().result()]
        with temporary_settings(updates={PREFECT_TASK_DEFAULT_RETRIES: 5}):
            seen.append(retries_setting.submit().result())
        seen.append(retries_setting.submit().result())
        seen.append(worker_niceness.submit().result())
        # the flow's way of passing the run's handles: the task run gets the object itself
        handles = opaque(Handles())
        seen.append([opaque_parameter.submit(handles).result() for _ in range(6)])
        seen.append(opaque_parameter.submit(opaque(Handles(config={"rollout": {"n": 32}}))).result())
        held = [held_services.submit().result() for _ in range(8)]
        seen.append([flow_run_seen.submit().result() for _ in range(4)])
        stored = [str(serialized["flow_run"]["id"]) for serialized, _ in context_cache._stored.kept.values()]
        seen.append((str(FlowRunContext.get().flow_run.id), stored))
        future = speak.submit()  # the last: Ray goes down right after it
        return future.result(), str(future.task_run_id), seen, held


@task(name="after-fail")
def after_fail() -> None:
    pass


@flow(task_runner=FastRayTaskRunner())
def failing_task() -> tuple[str, list[str], list]:
    future = fail.submit()
    never_runs = after_fail.submit(wait_for=[future])  # as the loop's sync waits on its train
    future.wait()
    never_runs.wait()
    # no waiting for reports here: a failed task run sends its logs before its result
    messages = asyncio.run(_messages(str(future.task_run_id)))
    # the flow's final wait: the failed run is reported, the one that never ran has nothing to wait for
    missing = FlowRunContext.get().task_runner.wait_reported(timeout_s=5)
    return str(future.task_run_id), messages, missing


async def _messages(task_run_id: str) -> list[str]:
    async with get_client() as client:
        logs = await client.read_logs(
            log_filter=LogFilter(task_run_id=LogFilterTaskRunId(any_=[task_run_id]))
        )
        return [log.message for log in logs]


async def _state(task_run_id: str) -> str:
    async with get_client() as client:
        (run,) = await client.read_task_runs(
            task_run_filter=TaskRunFilter(id=TaskRunFilterId(any_=[task_run_id]))
        )
        return run.state.type.value


def _exported_task_bodies() -> list[str]:
    """The remote functions Ray's GCS holds for this job whose name is the task body's."""
    from ray.experimental.internal_kv import _internal_kv_get, _internal_kv_list

    names = [
        pickle.loads(_internal_kv_get(key, namespace=b"fun"))["function_name"]
        for key in _internal_kv_list(b"RemoteFunction:", namespace=b"fun")
    ]
    return [n for n in names if n.endswith(FastRayTaskRunner.task_body.__name__)]


def test_override_reports_worker_logs_and_states_before_ray_stops(prefect_log_batches):
    env = prefect_log_batches
    value, task_run_id, seen, held = one_task()
    # 18 task runs, one remote function: exported to the GCS (and fetched by a worker) once
    assert len(_exported_task_bodies()) == 1
    ray.shutdown()
    # the flow run's context went to the object store once; every task run saw that flow
    # run, and each worker unpickled the one copy once
    flow_run_id, stored = seen.pop()
    assert stored.count(flow_run_id) == 1  # (other flow runs of this process may have theirs)
    by_worker = {}
    for run_id, flow_name, pid, loaded in seen.pop():
        assert (run_id, flow_name) == (flow_run_id, "one-task")
        by_worker.setdefault(pid, set()).update(loaded)
    assert all(len(keys) == 1 for keys in by_worker.values()), by_worker
    assert value == 7
    assert MARK in asyncio.run(_messages(task_run_id))
    assert asyncio.run(_state(task_run_id)) == "COMPLETED"
    # not the plain tuple Ray makes of the annotation; another handles object is its own
    assert seen.pop()[:2] == ("Handles", 32)
    # the same handles object went to the object store once: each worker unpickled it once,
    # not once per task run (prefect-ray's way: Ray pickles every argument at every submit)
    runs = seen.pop()
    assert {run[:2] for run in runs} == {("Handles", 16)}
    counts: dict[int, set] = {}
    for _, _, pid, unpickled in runs:
        counts.setdefault(pid, set()).add(unpickled)
    assert max(len([r for r in runs if r[2] == pid]) for pid in counts) >= 2, runs  # a worker ran 2+
    assert all(len(seen_counts) == 1 for seen_counts in counts.values()), counts
    # Ray's workers run 15 below this process (at 15 from 0), the run's own API server below
    # them (api_server.py); niceness stops at 19
    assert seen.pop() == min(os.getpriority(os.PRIO_PROCESS, 0) + 15, 19)
    assert SERVER_NICENESS > 15
    # settings changed in the flow reach the next task run, and changed back the one after
    assert [retries for retries, _ in seen] == [0, 5, 0]
    assert {url for _, url in seen} == {env["PREFECT_API_URL"].rstrip("/") + "/"}
    # a worker's log and events services must not pile up over its task runs (stopped ones
    # once held 1-2 MB per task run, two services and their hooks each time)
    by_worker: dict[int, list] = {}
    for pid, alive, hooks in held:
        by_worker.setdefault(pid, []).append((alive, hooks))
    pid, counts = max(by_worker.items(), key=lambda kv: len(kv[1]))
    assert len(counts) >= 4, by_worker
    (alive_early, hooks_early), (alive_late, hooks_late) = counts[1], counts[-1]
    assert alive_late <= alive_early + 2 and hooks_late <= hooks_early + 2, f"worker {pid}: {counts}"


@task(name="speak-twice")
def speak_twice() -> None:
    get_run_logger().info("quiet-on-the-terminal")
    get_run_logger().warning("loud-on-the-terminal")


@flow(task_runner=FastRayTaskRunner())
def speaking() -> str:
    with task_runs_reported():
        future = speak_twice.submit()
        future.wait()
        return str(future.task_run_id)


def test_task_runs_print_warnings_on_the_terminal_and_keep_info_for_the_ui(prefect_log_batches, capfd):
    task_run_id = speaking()
    # Ray forwards worker output to the driver as its log monitor reads it: wait for the
    # warning; the info line, written before it by the same worker, would have come first
    printed, deadline = "", time.monotonic() + 30
    while "loud-on-the-terminal" not in printed and time.monotonic() < deadline:
        time.sleep(0.2)
        printed += "".join(capfd.readouterr())
    assert "loud-on-the-terminal" in printed
    assert "quiet-on-the-terminal" not in printed
    messages = asyncio.run(_messages(task_run_id))  # the UI has both
    assert "quiet-on-the-terminal" in messages and "loud-on-the-terminal" in messages


@task(name="slow-upstream")
def slow_upstream() -> int:
    time.sleep(1.5)
    return 1


@task(name="downstream")
def downstream() -> int:
    return 2


@flow(task_runner=FastRayTaskRunner())
def upstream_then_downstream() -> tuple[str, str, int]:
    # as the loop's control tasks: no CPU asked, so nothing but the dependency holds it back
    with task_runs_reported(), remote_options(num_cpus=0):
        first = slow_upstream.submit()
        second = downstream.submit(wait_for=[first])
        return str(first.task_run_id), str(second.task_run_id), second.result()


async def _states(task_run_id: str) -> list:
    async with get_client() as client:
        return await client.read_task_run_states(task_run_id)


def test_a_task_run_starts_once_what_it_waits_for_is_done(prefect_log_batches):
    first, second, value = upstream_then_downstream()
    assert value == 2
    upstream_done = next(s.timestamp for s in asyncio.run(_states(first)) if s.type.value == "COMPLETED")
    states = asyncio.run(_states(second))
    # Ray held it: the downstream task run came to be (Pending) after the upstream completed,
    # instead of starting at once and waiting on its worker
    assert states[0].type.value == "PENDING" and states[0].timestamp >= upstream_done
    assert states[-1].type.value == "COMPLETED"
    # the UI still shows the edge
    (run,) = asyncio.run(_task_runs([second]))
    assert [str(i.id) for i in run.task_inputs["wait_for"]] == [first]


@task(name="reports-an-earlier-failure")
def reports_an_earlier_failure() -> dict:
    # a result that holds a failed state as data (say, what an earlier attempt ended in)
    return {"earlier": Failed(message="an earlier attempt"), "tries": 2}


@flow(task_runner=FastRayTaskRunner())
def waits_on_a_result_holding_a_state() -> tuple[str, str]:
    with task_runs_reported(), remote_options(num_cpus=0):
        first = reports_an_earlier_failure.submit()
        second = downstream.submit(wait_for=[first])
        third = downstream.submit(wait_for=[fail.submit()])
        second.wait()
        third.wait()
        return second.state.name, third.state.name


def test_what_a_task_run_waits_for_is_its_upstream_not_the_upstreams_result(prefect_log_batches):
    # As on Prefect's own runners: `wait_for` asks that the upstream completed. The upstream's
    # result is not walked for more dependencies (it was, when the worker got the upstream's
    # state: a failed state inside its data kept the downstream from running, and every
    # task run walked its upstream's whole result before starting).
    after_result_holding_a_failure, after_failure = waits_on_a_result_holding_a_state()
    assert after_result_holding_a_failure == "Completed"
    assert after_failure == "NotReady"  # a failed upstream still keeps it from running


async def _task_runs(ids: list[str]) -> list:
    async with get_client() as client:
        return await client.read_task_runs(task_run_filter=TaskRunFilter(id=TaskRunFilterId(any_=ids)))


def test_a_failed_task_run_sends_its_logs_before_its_result(slow_log_batches):
    _, messages, missing = failing_task()
    assert MARK in messages
    assert any(m.startswith("Finished in state Failed") for m in messages)
    assert missing == []


def test_wait_reported_gives_up_on_task_runs_the_api_never_heard_of(prefect_api):
    missing = uuid4()
    assert wait_reported([missing], timeout_s=0.3) == [missing]


def test_the_flow_runs_part_of_a_task_runs_context_is_serialized_once_per_context():
    contexts = context_cache.SerializedContexts()
    noop = task(name="noop")(lambda: None)

    def serialized() -> dict:
        return contexts({"task": noop, "task_run_id": uuid4(), "task_inputs": {}, "copy_to_child_ctx": True})

    first = serialized()
    again = serialized()
    assert again["settings_context"] is first["settings_context"]  # the flow's submits reuse it
    assert again["asset_context"] is not first["asset_context"]  # the task run's own part is its own
    with temporary_settings(updates={PREFECT_TASK_DEFAULT_RETRIES: 3}):
        changed = serialized()
    assert changed["settings_context"] is not first["settings_context"]
    assert changed["settings_context"]["settings"]["tasks"]["default_retries"] == 3
    with tags("a-tag"):  # a tags context entered is a new one too
        assert serialized()["tags_context"]["current_tags"] == {"a-tag"}
    assert serialized()["settings_context"] is first["settings_context"]
    assert SettingsContext.get().serialize() is not SettingsContext.get().serialize()  # nothing patched
