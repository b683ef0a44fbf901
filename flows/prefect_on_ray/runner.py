"""A RayTaskRunner that joins the Ray cluster the flow body connected to.

The cluster address and the workers' environment come from the flow's config parameter,
which a task runner fixed at decoration time cannot see; so this runner starts no Ray
itself and the flow connects (and disconnects) through infra.system.RLSystem.

It also carries task parameters wrapped in Prefect's `opaque` across Ray intact, so the
flow can hand every task run the run's handles without Prefect walking their tree (and
without Ray pickling them for every task run: they go to the object store once), and
submits every task run through one Ray remote function per set of remote options.
"""

from __future__ import annotations

import json
import logging
from collections import OrderedDict, deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any
from uuid import UUID, uuid4

import ray
from prefect.client.schemas.objects import State, StateDetails
from prefect.context import FlowRunContext, serialize_context
from prefect.futures import PrefectTaskRunFuture
from prefect.states import Failed
from prefect.task_runners import TaskRunner
from prefect.utilities.annotations import opaque
from prefect.utilities.engine import collect_task_run_inputs_sync
from prefect_ray import RayTaskRunner
from prefect_ray.context import RemoteOptionsContext
from prefect_ray.task_runners import PrefectRayFuture

from flows.prefect_on_ray.context_cache import (
    reused_prefect_context,
    serialize_contexts_once,
    store_flow_run_context,
)
from flows.prefect_on_ray.object_store import GetOnce, PutOnce
from flows.prefect_on_ray.reporting import send_reports_now, wait_reported
from infra.cluster.control_workers import RECENT_PER_WORKER, current_pool

# task runs whose reports the flow waits for before Ray goes down: more than one iteration's
REMEMBERED_TASK_RUNS = 32


class _Opaque:
    """A task parameter wrapped in Prefect's `opaque`, on its way through Ray: the annotation
    is a tuple subclass, which Ray's argument serialization turns into a plain tuple. The value
    itself goes to Ray's object store once per flow run (object_store.py); the carrier
    holds its reference."""

    def __init__(self, ref: ray.ObjectRef) -> None:
        self.ref = ref


# worker side: the opaque values of the task runs this worker ran, each unpickled once
_opaque_values = GetOnce()
# worker side: the final states of the last task runs it ran, for those queued behind them (as
# many as the pool counts as ran before a task run it sends there)
_finished_states: OrderedDict[UUID, State] = OrderedDict()


class _Finished(PrefectTaskRunFuture):
    """A task run this one waited for, handed to Prefect's `wait_for` as a future that is done.

    Ray resolved it to its final state; given the bare state, Prefect's task engine walks it
    to the bottom, through the upstream's whole result, once to check that it completed and
    once for the UI's edge: about a third of a task run's start in a cProfile of the demo's
    workers (about 1 of its ~8 ms in a timeline), and a state found inside the result counted
    as one more upstream (a failed one kept the task run from running). A future, as on
    Prefect's own runners, is taken as it is: its run completed or not, and its id is the edge."""

    def __init__(self, state: State) -> None:
        super().__init__(state.state_details.task_run_id)
        self._final_state = state

    def wait(self, timeout: float | None = None) -> None:
        return None

    def result(self, timeout: float | None = None, raise_on_failure: bool = True) -> Any:
        return self._final_state.result(raise_on_failure=raise_on_failure, _sync=True)

    def add_done_callback(self, fn: Callable[[PrefectTaskRunFuture], None]) -> None:
        fn(self)


class ConnectedRayTaskRunner(RayTaskRunner):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.recent: deque = deque(maxlen=REMEMBERED_TASK_RUNS)
        self._remote_functions: dict[str, ray.remote_function.RemoteFunction] = {}
        self._put_opaque = PutOnce()  # this flow run's opaque parameters, by identity

    def __enter__(self):
        TaskRunner.__enter__(self)  # skip RayTaskRunner's ray.init: the flow body connects
        serialize_contexts_once()
        return self

    def __exit__(self, *exc_info):
        TaskRunner.__exit__(self, *exc_info)

    def duplicate(self) -> ConnectedRayTaskRunner:
        return type(self)()

    def submit(self, task, parameters, wait_for=None, dependencies=None):
        """prefect-ray's submit, through a remote function made once per set of remote options.

        prefect-ray wraps its task body in a new `ray.remote` at every submit. Ray gives each
        remote function a new id, so every task run pickled and exported the body to the GCS
        again (a fifth of the flow process's CPU in a profile of the loop), every worker
        fetched and registered it again before running it, and the GCS kept every copy."""
        if not self._started:
            raise RuntimeError("The task runner must be started before submitting work.")
        task_run_id = uuid4()
        task_inputs = {
            k: collect_task_run_inputs_sync(v, future_cls=PrefectRayFuture) for k, v in parameters.items()
        }
        context = serialize_context(
            asset_ctx_kwargs={
                "task": task,
                "task_run_id": task_run_id,
                "task_inputs": task_inputs,
                "copy_to_child_ctx": True,
            }
        )
        context = store_flow_run_context(context)  # its largest part, by reference
        parameters, upstream_refs = self._exchange_prefect_for_ray_futures(parameters)
        # The task runs it waits for go to Ray as task arguments: Ray starts this one once they
        # are done and hands it their final states. prefect-ray passes them inside `wait_for`
        # and the worker waited with ray.get on those nested refs; twice in ~4000 iterations at
        # 8 prompts x 8 samples such a wait never returned although the task run it waited
        # for had completed (the run hung: the worker had borrowed the same ref for the task
        # run before). A task's own arguments are resolved by the owner, Ray's documented way.
        # On a control worker, the upstream it is queued behind is not even that: the worker
        # runs what it was sent in order, and keeps the final states of what it ran.
        awaited = {f.wrapped_future: f.task_run_id for f in wait_for or [] if isinstance(f, PrefectRayFuture)}
        others = [f for f in wait_for or [] if not isinstance(f, PrefectRayFuture)]
        kwargs = dict(
            task=task,
            task_run_id=task_run_id,
            parameters=parameters,
            wait_for=others or None,
            dependencies=dependencies,
            context=context,
        )
        pool = current_pool()
        if pool is not None and pool.serves(RemoteOptionsContext.get().current_remote_options or {}):
            # on the run's control workers: what this task run waits for and the worker it goes
            # to ran before it (a chain) needs no Ray argument, ordering makes it wait
            worker, ran_before = pool.pick(list(awaited))
            remote = [ref for ref in awaited if ref not in ran_before]
            kwargs["ran_before"] = [awaited[ref] for ref in ran_before]
            ref = pool.send(
                worker,
                self._run_prefect_task,
                *upstream_refs,
                *remote,
                name=task.name,
                awaited=len(remote),
                **kwargs,
            )
        else:
            ref = (
                self._remote_function()
                .options(name=task.name)
                .remote(*upstream_refs, *awaited, awaited=len(awaited), **kwargs)
            )
        future = PrefectRayFuture(task_run_id=task_run_id, wrapped_future=ref)
        self.recent.append(future)
        return future

    def _remote_function(self) -> ray.remote_function.RemoteFunction:
        """The task body as a Ray remote function with the current remote options."""
        options = RemoteOptionsContext.get().current_remote_options or {}
        key = json.dumps(options, sort_keys=True, default=repr)
        if key not in self._remote_functions:
            decorator = ray.remote(**options) if options else ray.remote
            self._remote_functions[key] = decorator(self._run_prefect_task)
        return self._remote_functions[key]

    def _exchange_prefect_for_ray_futures(self, kwargs_prefect_futures: dict) -> tuple[dict, list]:
        """prefect-ray's exchange of futures for Ray refs; an `opaque` parameter (which it does
        not walk into) then travels by reference in a carrier the task body unwraps into
        `opaque` again."""
        parameters, refs = super()._exchange_prefect_for_ray_futures(kwargs_prefect_futures)
        carried = {
            k: _Opaque(self._put_opaque(v.unwrap())) if isinstance(v, opaque) else v
            for k, v in parameters.items()
        }
        return carried, refs

    def wait_reported(self, timeout_s: float = 30.0) -> list:
        """Wait until the API holds the final state and last log of the recent task runs
        that finished (reporting.py); the ids still missing after `timeout_s`."""
        futures = list(self.recent)
        refs = [f.wrapped_future for f in futures]
        done, _ = ray.wait(refs, num_returns=len(refs), timeout=0) if refs else ([], [])
        done_refs = set(done)
        # a task run that never ran (its upstream failed: NotReady) has no final state to wait for
        ended = [f.task_run_id for f in futures if f.wrapped_future in done_refs and _final(f.wrapped_future)]
        return wait_reported(ended, timeout_s)

    @staticmethod
    def _run_prefect_task(
        *upstream_ray_obj_refs, context: dict, awaited: int = 0, ran_before: list[UUID] = (), **kwargs
    ):
        """prefect-ray's task body in the worker's reused settings and API client
        (context_cache.py), with `opaque` parameters as the flow passed them, and the
        final states of the task runs it waited for (the last `awaited` arguments, resolved
        by Ray, and those of `ran_before`, run earlier by this control worker) as its
        `wait_for`. A completed task run's logs and states go to the API with the worker's
        next batch; a failed one's before its result returns (reporting.py)."""
        completed = False
        waited = [_Finished(_finished_here(task_run_id)) for task_run_id in ran_before]
        if awaited:
            waited += [_Finished(state) for state in upstream_ray_obj_refs[-awaited:]]
            upstream_ray_obj_refs = upstream_ray_obj_refs[:-awaited]
        if waited:
            kwargs["wait_for"] = [*(kwargs.get("wait_for") or []), *waited]
        parameters = kwargs.get("parameters") or {}
        kwargs["parameters"] = {
            k: opaque(_opaque_values(v.ref)) if isinstance(v, _Opaque) else v for k, v in parameters.items()
        }
        try:
            with reused_prefect_context(context) as reused:
                state = RayTaskRunner._run_prefect_task(*upstream_ray_obj_refs, context=reused, **kwargs)
            _finished_states[kwargs["task_run_id"]] = state
            while len(_finished_states) > RECENT_PER_WORKER:
                _finished_states.popitem(last=False)
            completed = state.is_completed()
            return state
        finally:
            if not completed:
                send_reports_now()


def _finished_here(task_run_id: UUID) -> State:
    """The final state of a task run this worker ran: one that the task run about to start
    waits for and was queued behind on the same control worker."""
    state = _finished_states.get(task_run_id)
    if state is None:  # it ended without a state: Ray's error (the worker's log) is all there is
        state = Failed(
            message=f"task run {task_run_id}, which this one waits for, ended on this worker without a final state",
            state_details=StateDetails(task_run_id=task_run_id),
        )
    return state


def _final(ref: ray.ObjectRef) -> bool:
    try:
        return ray.get(ref, timeout=0).is_final()
    except Exception:  # noqa: BLE001 - the worker died: whatever it reported is all there is
        return False


@contextmanager
def task_runs_reported(timeout_s: float = 30.0) -> Iterator[None]:
    """On leaving (also by an error): wait until this flow run's recent task runs are
    reported to the API, while the Ray workers that send the reports still live."""
    try:
        yield
    finally:
        runner = FlowRunContext.get().task_runner
        if isinstance(runner, ConnectedRayTaskRunner):
            try:
                runner.wait_reported(timeout_s)
            except Exception as e:  # noqa: BLE001 - must not hide the run's own error
                logging.getLogger(__name__).warning("could not check the task runs' reports: %s", e)
