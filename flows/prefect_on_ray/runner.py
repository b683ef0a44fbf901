"""The fast runner: Prefect task runs on the Ray cluster the flow's process is connected to.

The cluster address and the workers' environment come from the flow's config parameter,
which a task runner fixed at decoration time cannot see; so this runner starts no Ray
itself: `python -m flows.train` connects before the flow run (infra.cluster.ray_cluster.
ray_session), or the flow body does (infra.system.RLSystem).

It submits what prefect-ray's RayTaskRunner submits (its `submit`, as of prefect-ray 0.5.0),
with its own task body (task_body.py), and differs where that is slow or fragile:
- one Ray remote function per set of remote options, not a new one per task run;
- task runs go to the run's control workers (infra/cluster/control_workers.py) when the
  remote options are theirs;
- the task runs one waits for go to Ray as task arguments (or, queued behind them on the
  same control worker, not at all), never nested in `wait_for`;
- parameters wrapped in Prefect's `opaque` cross Ray intact, by reference: the flow can hand
  every task run the run's handles without Prefect walking their tree (and without Ray
  pickling them for every task run: they go to the object store once);
- the flow run's part of the serialized context is made once (context_cache.py).
"""

from __future__ import annotations

import json
import logging
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, TypeVar
from uuid import UUID, uuid4

import ray
from prefect.context import FlowRunContext
from prefect.task_runners import TaskRunner
from prefect.utilities.annotations import opaque
from prefect.utilities.collections import visit_collection
from prefect.utilities.engine import collect_task_run_inputs_sync
from prefect_ray.context import RemoteOptionsContext
from prefect_ray.task_runners import PrefectRayFuture

from flows.prefect_on_ray.context_cache import SerializedContexts, store_flow_run_context
from flows.prefect_on_ray.object_store import PutOnce
from flows.prefect_on_ray.reporting import wait_reported
from flows.prefect_on_ray.task_body import Opaque, run_and_report
from infra.cluster.control_workers import current_pool

# task runs whose reports the flow waits for before Ray goes down: more than one iteration's
REMEMBERED_TASK_RUNS = 32

T = TypeVar("T")


class FastRayTaskRunner(TaskRunner[PrefectRayFuture]):
    # what a Ray worker runs for a task run (a function Ray pickles by reference)
    task_body = staticmethod(run_and_report)

    def __init__(self) -> None:
        super().__init__()
        self.recent: deque[PrefectRayFuture] = deque(maxlen=REMEMBERED_TASK_RUNS)
        self._remote_functions: dict[str, ray.remote_function.RemoteFunction] = {}
        self._put_opaque = PutOnce()  # this flow run's opaque parameters, by identity
        self._contexts = SerializedContexts()

    def duplicate(self) -> FastRayTaskRunner:
        return type(self)()

    def submit(self, task, parameters, wait_for=None, dependencies=None) -> PrefectRayFuture:
        """Send a task run to Ray: to a control worker, or through a remote function made
        once per set of remote options.

        prefect-ray wraps its task body in a new `ray.remote` at every submit. Ray gives each
        remote function a new id, so every task run pickled and exported the body to the GCS
        again (a fifth of the flow process's CPU in a profile of the loop), every worker
        fetched and registered it again before running it, and the GCS kept every copy."""
        if not self._started:
            raise RuntimeError("The task runner must be started before submitting work.")
        task_run_id = uuid4()
        context = self._serialized_context(task, task_run_id, parameters)
        parameters, upstream_refs = self._to_ray(parameters)
        # The task runs it waits for go to Ray as task arguments: Ray starts this one once they
        # are done and hands it their final states. prefect-ray passes them inside `wait_for`
        # and the worker waited with ray.get on those nested refs; twice in ~4000 iterations at
        # 8 prompts x 8 samples such a wait never returned although the task run it waited
        # for had completed (the run hung: the worker had borrowed the same ref for the task
        # run before). A task's own arguments are resolved by the owner, Ray's documented way.
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
        ref = self._send(task.name, upstream_refs, awaited, kwargs)
        future = PrefectRayFuture(task_run_id=task_run_id, wrapped_future=ref)
        self.recent.append(future)
        return future

    def _serialized_context(self, task, task_run_id: UUID, parameters: dict) -> dict[str, Any]:
        """Prefect's context for the task run, its flow run part by reference (context_cache.py)."""
        task_inputs = {
            k: collect_task_run_inputs_sync(v, future_cls=PrefectRayFuture) for k, v in parameters.items()
        }
        context = self._contexts(
            {"task": task, "task_run_id": task_run_id, "task_inputs": task_inputs, "copy_to_child_ctx": True}
        )
        return store_flow_run_context(context)  # its largest part, by reference

    def _to_ray(self, parameters: dict[str, Any]) -> tuple[dict[str, Any], list[ray.ObjectRef]]:
        """The parameters with prefect-ray futures exchanged for their Ray refs (Prefect does
        not walk into an `opaque` one, which travels by reference in a carrier the task body
        unwraps into `opaque` again), and those refs, for Ray to wait on."""
        refs: list[ray.ObjectRef] = []

        def exchange(expr: Any) -> Any:
            if isinstance(expr, PrefectRayFuture):
                refs.append(expr.wrapped_future)
                return expr.wrapped_future
            return expr

        exchanged = visit_collection(parameters, visit_fn=exchange, return_data=True)
        carried = {
            k: Opaque(self._put_opaque(v.unwrap())) if isinstance(v, opaque) else v
            for k, v in exchanged.items()
        }
        return carried, refs

    def _send(
        self, name: str, upstream_refs: list, awaited: dict[ray.ObjectRef, UUID], kwargs: dict
    ) -> ray.ObjectRef:
        """The task run to the run's control workers when the remote options are theirs (what
        it waits for and the worker ran before it, a chain, needs no Ray argument: ordering
        makes it wait), else to Ray through the remote function of the current options."""
        pool = current_pool()
        if pool is not None and pool.serves(RemoteOptionsContext.get().current_remote_options or {}):
            worker, ran_before = pool.pick(list(awaited))
            remote = [ref for ref in awaited if ref not in ran_before]
            kwargs["ran_before"] = [awaited[ref] for ref in ran_before]
            return pool.send(
                worker, self.task_body, *upstream_refs, *remote, name=name, awaited=len(remote), **kwargs
            )
        remote_function = self._remote_function().options(name=name)
        return remote_function.remote(*upstream_refs, *awaited, awaited=len(awaited), **kwargs)

    def _remote_function(self) -> ray.remote_function.RemoteFunction:
        """The task body as a Ray remote function with the current remote options."""
        options = RemoteOptionsContext.get().current_remote_options or {}
        key = json.dumps(options, sort_keys=True, default=repr)
        if key not in self._remote_functions:
            decorator = ray.remote(**options) if options else ray.remote
            self._remote_functions[key] = decorator(self.task_body)
        return self._remote_functions[key]

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


def _final(ref: ray.ObjectRef) -> bool:
    try:
        return ray.get(ref, timeout=0).is_final()
    except Exception:  # noqa: BLE001 - the worker died: whatever it reported is all there is
        return False


def for_every_task_run(value: T) -> T | opaque[T]:
    """`value` as every task run of this flow run gets it: on the fast runner, in Prefect's
    `opaque`, which the runner carries through Ray's object store once and Prefect does not
    walk; on any other runner as it is (prefect-ray hands an `opaque` to its task body as a
    bare tuple: Ray serializes tuple subclasses as tuples)."""
    context = FlowRunContext.get()
    return (
        opaque(value) if context is not None and isinstance(context.task_runner, FastRayTaskRunner) else value
    )


@contextmanager
def task_runs_reported(timeout_s: float = 30.0) -> Iterator[None]:
    """On leaving (also by an error): wait until this flow run's recent task runs are
    reported to the API, while the Ray workers that send the reports still live (on the
    fast runner; another one leaves the reports to Prefect's own services)."""
    try:
        yield
    finally:
        runner = FlowRunContext.get().task_runner
        if isinstance(runner, FastRayTaskRunner):
            try:
                runner.wait_reported(timeout_s)
            except Exception as e:  # noqa: BLE001 - must not hide the run's own error
                logging.getLogger(__name__).warning("could not check the task runs' reports: %s", e)
