"""The RL loop as a Prefect flow: generate, train, save, sync, eval.

    python -m flows.train                               # the tiny CPU demo
    python -m flows.train --config FILE.yaml key.path=value ...

In async mode generation of k+1 is submitted before training on k starts, so engines and
trainer overlap (one step off-policy). Before every weight sync the in-flight generation
is drained, and the next one is submitted only after it: a sample is at most one optimizer
step behind the weights that train on it when update_weights_interval is 1 (with N, up to N).
"""

from __future__ import annotations

from infra.cluster.cluster_token import require_cluster_token

# before anything imports Ray (prefect_ray does): Ray reads its auth mode at import
require_cluster_token()

import argparse
import importlib
import sys
import threading
import time

from prefect import flow, get_run_logger
from prefect_ray.context import remote_options

from flows.ahead import GenerateAhead, TrainingAhead
from flows.artifacts import RunArtifacts
from flows.prefect_on_ray import (
    ApiServerStart,
    for_every_task_run,
    task_runner,
    task_runs_reported,
    worker_env,
)
from flows.results import persisted
from infra import startup
from infra.cluster.control_workers import CONTROL_OPTIONS
from infra.cluster.ray_cluster import ray_session
from infra.config import RunConfig
from infra.config_files import load_config
from infra.preflight import already_finished, preflight
from infra.schedule import LoopSchedule
from tasks.evaluate import evaluate
from tasks.generate import generate
from tasks.save import save
from tasks.sync import sync
from tasks.train import train as train_step
from tasks.train_critic import train_critic

startup.mark("imports")

# What a Ray worker imports to run a task run; loaded while the engines start, not during
# the first iterations (Prefect imports lazily: `import prefect` alone defers most of it).
WORKER_IMPORTS = [
    "prefect.task_engine",
    "prefect.client.orchestration",
    "prefect_ray.task_runners",
    "tasks.train",
    "tasks.train_critic",
]

# What the flow's process imports for RLSystem.start and the preflight; main() loads it
# beside Ray's start. No torch: the tiny model comes from the machine's cache once built.
PRELOAD = ["infra.system", "transformers.tokenization_utils_fast"]


@flow(name="train", task_runner=task_runner(), validate_parameters=True)
def train(config: RunConfig = RunConfig()) -> dict:  # noqa: B008 - the UI shows the defaults as a form
    log = get_run_logger()
    startup.mark("flow_run_started")
    # config, plug-ins, data, model, storage, run folder: all checked before any actor starts
    checked = preflight(config)
    startup.mark("preflight")
    for warning in checked.warnings:
        log.warning(warning)
    if checked.finished:
        log.info(checked.finished)
        return {"final": {}, "finished": checked.finished}
    # task results go to the run's own storage (a block the code creates, not a person)
    generate_, train_, critic_, save_, sync_, eval_ = persisted(
        config, generate, train_step, train_critic, save, sync, evaluate
    )
    from infra.system import RLSystem  # noqa: PLC0415 - torch & co: main() imports it beside Ray's start

    system = RLSystem(config, worker_env(), warm_imports=WORKER_IMPORTS)
    # leaving: the task runs' last logs and states reach the API before Ray stops the workers
    with system as run, remote_options(**CONTROL_OPTIONS), task_runs_reported():
        # the task runs go to the run's control workers (infra/cluster/control_workers.py),
        # warmed while the actors started
        log.info("placement (node ids): %s", system.placement)
        log.info("process ids: %s", system.pids)  # what to look for when a process dies
        # what the task runs get: on the fast runner, opaque, so Prefect passes it as it is
        # instead of walking (and rebuilding) its tree, the whole config inside, on every
        # submit and again on the worker before the task's body
        handles = for_every_task_run(run)
        start = run.restore()  # next rollout id; the weights hold `start` training iterations
        startup.mark("restore")
        schedule = LoopSchedule.from_config(config, checked.num_train_prompts, start)
        log.info(
            "run %s: iterations %d..%d, mode %s",
            config.run_name,
            start,
            schedule.num_rollout - 1,
            config.mode,
        )
        report = RunArtifacts(config, start, schedule.num_rollout)
        sync_.submit(handles, start).result()
        startup.mark("first_sync")

        ahead = config.mode == "async"
        batches = GenerateAhead(lambda k, after: generate_.submit(handles, k, wait_for=after))

        def submit_training(k: int, after: list) -> list:
            # ppo: the critic trains beside the actor; the actor sits out critic-only iterations
            critic = critic_.submit(handles, k, wait_for=after) if config.critic.enabled else None
            actor = train_.submit(handles, k, wait_for=after) if schedule.actor_trains(k) else None
            return [f for f in (critic, actor) if f is not None]

        training = TrainingAhead(submit_training)
        batches.submit(start)
        row: dict = {}
        ended = (time.monotonic(), time.time())  # when the last iteration's sync returned
        for k in range(start, schedule.num_rollout):
            # an iteration starts when its training can: now, or as the previous sync ended
            t0, started = ended if training.submitted(k) else (time.monotonic(), time.time())
            rollout = batches.take(k)
            if k == start:  # where the time from the command to the first generate went
                log.info("startup, seconds since the command: %s", run.record_startup(rollout))
            if ahead and schedule.has_next(k):
                batches.submit(k + 1)

            # colocated (sync mode only, nothing in flight): engines give the trainer the devices
            released = run.release_engines() if config.cluster.colocate else {}
            trained = training.take(k)
            # the sync's task run is submitted now; Ray starts it once training and the batch
            # generated ahead are done (no generation may be in flight while weights change),
            # without waiting for this loop. Colocated, the engines first get their devices back.
            synced = None
            if schedule.sync_after(k) and not config.cluster.colocate:
                synced = sync_.submit(handles, k + 1, wait_for=trained + batches.in_flight())
            # so is the next iteration's training, behind that sync (flows/ahead.py)
            if ahead and not config.cluster.colocate and schedule.train_ahead(k):
                training.submit(k + 1, after=[synced] if synced else trained + batches.in_flight())
            row = {**rollout, **released, "time_train_s": 0.0}
            for future in trained:
                row.update(future.result())
            if config.cluster.colocate:
                row.update(run.resume_engines())
            if schedule.sync_after(k):
                batches.drain()
                row.update((synced or sync_.submit(handles, k + 1)).result())
            ended = (time.monotonic(), time.time())  # a training submitted ahead starts about now
            if schedule.eval_after(k):
                result = eval_.submit(handles, k).result()
                report.evaluated(k, result)
                row.update({key: v for key, v in result.items() if key != "examples"})
            row["time_iteration_s"] = time.monotonic() - t0
            row["time_started_unix"] = started  # start to start also counts the save after the row
            run.record(row)  # before the checkpoint: a resumed run never lacks this row
            if schedule.save_after(k):
                batches.drain()  # the batch generated ahead is part of the checkpoint
                # as the seed: the writes overlap the next iterations, except the last save's
                report.saved(
                    save_.submit(handles, k, schedule.export_hf_after(k), not schedule.is_last(k)).result()
                )
            report.iteration_done(k)
            log.info(
                "iter %04d | reward %.3f | generate %.2fs train %.2fs sync %.2fs | weight version %d",
                k,
                row["reward_mean"],
                row["time_generate_s"],
                row["time_train_s"],
                row.get("time_sync_s", 0.0),
                row["weight_version"],
            )
        outputs = run.outputs()
    report.finish(outputs)  # table, reward curve, links: after Ray is down
    for name, uri in outputs.items():
        log.info("%s: %s", name, uri)
    return {"final": row, **outputs}


def _preload() -> None:
    """Import what the flow's start needs (the actor classes, the tokenizer code)
    while Ray starts; a later import of the same module waits for this one, never repeats it."""
    for module in PRELOAD:
        importlib.import_module(module)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m flows.train", description=__doc__.split("\n")[0])
    parser.add_argument("--config", help="YAML file with RunConfig fields")
    parser.add_argument("overrides", nargs="*", help="key.path=value settings applied after the file")
    args = parser.parse_args(argv)
    config = load_config(args.config, args.overrides)  # fails here, before anything starts
    startup.mark("config")
    finished = already_finished(config)  # nothing to do: start neither Ray nor the API
    if finished:
        print(finished, flush=True)
        return 0
    # Start-up work that does not depend on each other runs side by side: the Prefect API
    # server boots in its process, the trainer/engine code imports in a thread, Ray starts here.
    api = ApiServerStart()
    preload = threading.Thread(target=_preload, daemon=True)
    preload.start()
    with ray_session(config, worker_env(api.url)):  # the flow's RLSystem uses this cluster
        startup.mark("ray_connected")
        with api.ready():
            startup.mark("prefect_api")
            # done before the flow imports the same packages: transformers' lazy module, imported
            # from two threads at once, can hand one of them a half-initialised name (ImportError)
            preload.join()
            state = train(config, return_state=True)
    return 0 if state.is_completed() else 1


if __name__ == "__main__":
    sys.exit(main())
