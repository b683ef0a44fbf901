"""What the flow does before its loop: the preflight, the loop's tasks bound to the run's
result storage, then the run's actors started with the task runs routed to them."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, NamedTuple

from prefect import Task, get_run_logger
from prefect_ray.context import remote_options

from flows.early_start import pending, preflight_of
from flows.prefect_on_ray import for_every_task_run, task_runs_reported, worker_env
from flows.results import persisted
from infra import startup
from infra.cluster.control_workers import CONTROL_OPTIONS
from infra.config import RunConfig
from infra.preflight import Preflight
from tasks.evaluate import evaluate
from tasks.generate import generate
from tasks.save import save
from tasks.sync import sync
from tasks.train import train
from tasks.train_critic import train_critic

if TYPE_CHECKING:
    from flows.early_start import EarlyStart
    from infra.handles import RunHandles
    from infra.system import RLSystem

# What a Ray worker imports to run a task run; loaded while the engines start, not during
# the first iterations (Prefect imports lazily: `import prefect` alone defers most of it).
# The actors' modules too: Ray imports an actor's class wherever a handle to it is unpickled,
# and every task run gets the run's handles (the manager's module alone, with pandas, took a
# quarter of a second of the first sync).
WORKER_IMPORTS = [
    "prefect.task_engine",
    "prefect.client.orchestration",
    "prefect_ray.task_runners",
    *("tasks.generate", "tasks.train", "tasks.train_critic", "tasks.sync", "tasks.save", "tasks.evaluate"),
    *("infra.rollout.manager", "infra.engines.actor", "infra.trainer.rank", "infra.trainer.critic_rank"),
]


class RunTasks(NamedTuple):
    generate: Task
    train: Task
    train_critic: Task
    save: Task
    sync: Task
    evaluate: Task


def checked_run(config: RunConfig) -> Preflight:
    """Config, plug-ins, data, model, storage, run folder: all checked before any actor
    starts. Its warnings, and why a finished run has nothing to do, go to the run's log."""
    log = get_run_logger()
    startup.mark("flow_run_started")
    checked = preflight_of(config)  # the command's, when it started the system early
    startup.mark("preflight")
    for warning in checked.warnings:
        log.warning(warning)
    if checked.finished:
        log.info(checked.finished)
    return checked


def run_tasks(config: RunConfig) -> RunTasks:
    """The loop's tasks; their results go to the run's own storage (a block the code
    creates, not a person)."""
    return RunTasks(*persisted(config, generate, train, train_critic, save, sync, evaluate))


@contextmanager
def started_system(config: RunConfig) -> Iterator[tuple[RunHandles, object]]:
    """The run's actors, started (here, or by the command while the API server booted:
    flows/early_start.py), with this flow run's task runs routed to its control workers
    (infra/cluster/control_workers.py, warmed while the actors started). Yields the
    handles, and the handles as the task runs get them. On leaving, the task runs' last logs
    and states reach the API before Ray stops the workers."""
    early = pending(config)
    if early is not None:
        get_run_logger().info("actors: started by the command while the API server booted")
    with started(early or new_system(config, worker_env())) as (run, handles):
        yield run, handles


def new_system(config: RunConfig, env: dict[str, str]) -> RLSystem:
    """The run's system, not started yet; `env` reaches its Ray workers."""
    from infra.system import RLSystem  # noqa: PLC0415 - torch & co: flows/launch.py imports it beside Ray's start

    return RLSystem(config, env, warm_imports=WORKER_IMPORTS)


@contextmanager
def started(system: RLSystem | EarlyStart) -> Iterator[tuple[object, object]]:
    """`started_system` for any system: an RLSystem or a pipeline stage's (infra/stage_systems.py)."""
    log = get_run_logger()
    with system as run, remote_options(**CONTROL_OPTIONS), task_runs_reported():
        log.info("placement (node ids): %s", system.placement)
        log.info("process ids: %s", system.pids)  # what to look for when a process dies
        # on the fast runner, opaque: Prefect passes it as it is instead of walking (and
        # rebuilding) its tree, the whole config inside, on every submit and again on the
        # worker before the task's body
        yield run, for_every_task_run(run)
