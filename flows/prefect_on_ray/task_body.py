"""What a Ray worker runs for one task run of the fast runner (runner.py).

prefect-ray's task body (`RayTaskRunner._run_prefect_task`, as of prefect-ray 0.5.0) on
Prefect's public task engine, with three differences: the task run starts in the worker's
reused settings and API client (context_cache.py), gets its `opaque` parameters back from
the carriers they crossed Ray in, and waits for the final states it was handed (by Ray, or
kept by this worker) instead of for Ray refs nested in `wait_for`. A completed task run's
logs and states go to the API with the worker's next batch; a failed one's before its result
returns (reporting.py).
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Callable
from typing import Any
from uuid import UUID

import ray
from prefect.client.schemas.objects import State, StateDetails
from prefect.futures import PrefectTaskRunFuture
from prefect.states import Failed
from prefect.task_engine import run_task_async, run_task_sync
from prefect.utilities.annotations import opaque
from prefect.utilities.collections import visit_collection

from flows.prefect_on_ray.context_cache import reused_prefect_context
from flows.prefect_on_ray.object_store import GetOnce
from flows.prefect_on_ray.reporting import send_reports_now
from infra.cluster.control_workers import RECENT_PER_WORKER


class Opaque:
    """A task parameter wrapped in Prefect's `opaque`, on its way through Ray: the annotation
    is a tuple subclass, which Ray's argument serialization turns into a plain tuple. The value
    itself goes to Ray's object store once per flow run (object_store.py); the carrier holds
    its reference."""

    def __init__(self, ref: ray.ObjectRef) -> None:
        self.ref = ref


# the opaque values of the task runs this worker ran, each unpickled once
_opaque_values = GetOnce()
# the final states of the last task runs this worker ran, for those queued behind them (as
# many as the pool counts as ran before a task run it sends there)
_finished_states: OrderedDict[UUID, State] = OrderedDict()


class Finished(PrefectTaskRunFuture):
    """A task run this one waited for, handed to Prefect's `wait_for` as a future that is done.

    Ray resolved it to its final state; given the bare state, Prefect's task engine walks it
    to the bottom, through the upstream's whole result, once to check that it completed and
    once for the UI's edge: about a third of a task run's start in a cProfile of the demo's
    workers (about 1 of its ~8 ms in a timeline), and a state found inside the result counted
    as one more upstream (a failed one kept the task run from running). A future, as on
    Prefect's own runners, is taken as it is: its run completed or not, and its id is the edge."""

    def __init__(self, state: State) -> None:
        super().__init__(state.state_details.task_run_id)
        self._done = state

    @property
    def state(self) -> State:
        return self._done

    def wait(self, timeout: float | None = None) -> None:
        return None

    def result(self, timeout: float | None = None, raise_on_failure: bool = True) -> Any:
        return self._done.result(raise_on_failure=raise_on_failure, _sync=True)

    def add_done_callback(self, fn: Callable[[PrefectTaskRunFuture], None]) -> None:
        fn(self)


def _resolve_ref(expr: Any) -> Any:
    return ray.get(expr) if isinstance(expr, ray.ObjectRef) else expr


def run_prefect_task(
    *upstream_ray_obj_refs: Any,
    task: Any,
    task_run_id: UUID,
    context: dict[str, Any],
    parameters: dict[str, Any],
    wait_for: Any = None,
    dependencies: Any = None,
) -> State:
    """prefect-ray's task body: the task run's Ray refs nested in its parameters resolved (the
    top-level ones, its upstream arguments, only made Ray wait), then Prefect's task engine."""
    parameters = visit_collection(parameters, visit_fn=_resolve_ref, return_data=True)
    kwargs: dict[str, Any] = {
        "task": task,
        "task_run_id": task_run_id,
        "parameters": parameters,
        "wait_for": wait_for,
        "dependencies": dependencies,
        "context": context,
        "return_type": "state",
    }
    if task.isasync:  # Ray runs no coroutine: a sync entry point
        return asyncio.run(run_task_async(**kwargs))
    return run_task_sync(**kwargs)


def run_reused(
    *upstream_ray_obj_refs: Any, context: dict, awaited: int = 0, ran_before: list[UUID] = (), **kwargs: Any
) -> State:
    """The task run in the worker's reused settings and API client, with `opaque` parameters
    as the flow passed them, and the final states of the task runs it waited for (the last
    `awaited` arguments, resolved by Ray, and those of `ran_before`, run earlier by this
    control worker) as its `wait_for`."""
    waited = [Finished(finished_here(task_run_id)) for task_run_id in ran_before]
    if awaited:
        waited += [Finished(state) for state in upstream_ray_obj_refs[-awaited:]]
        upstream_ray_obj_refs = upstream_ray_obj_refs[:-awaited]
    if waited:
        kwargs["wait_for"] = [*(kwargs.get("wait_for") or []), *waited]
    parameters = kwargs.get("parameters") or {}
    kwargs["parameters"] = {
        k: opaque(_opaque_values(v.ref)) if isinstance(v, Opaque) else v for k, v in parameters.items()
    }
    with reused_prefect_context(context) as reused:
        state = run_prefect_task(*upstream_ray_obj_refs, context=reused, **kwargs)
    _finished_states[kwargs["task_run_id"]] = state
    while len(_finished_states) > RECENT_PER_WORKER:
        _finished_states.popitem(last=False)
    return state


def run_and_report(*upstream_ray_obj_refs: Any, **kwargs: Any) -> State:
    """The fast runner's task body: `run_reused`, and a task run that did not complete sends
    its logs and states to the API before its result returns."""
    completed = False
    try:
        state = run_reused(*upstream_ray_obj_refs, **kwargs)
        completed = state.is_completed()
        return state
    finally:
        if not completed:
            send_reports_now()


def finished_here(task_run_id: UUID) -> State:
    """The final state of a task run this worker ran: one that the task run about to start
    waits for and was queued behind on the same control worker."""
    state = _finished_states.get(task_run_id)
    if state is None:  # it ended without a state: Ray's error (the worker's log) is all there is
        state = Failed(
            message=f"task run {task_run_id}, which this one waits for, ended on this worker without a final state",
            state_details=StateDetails(task_run_id=task_run_id),
        )
    return state
