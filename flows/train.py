"""The RL loop as a Prefect flow: generate, train, save, sync, eval.

In async mode generation of k+1 is submitted before training on k starts, so engines and
trainer overlap (one step off-policy). Before every weight sync the in-flight generation
is drained, and the next one starts only after it: a sample is at most one optimizer
step behind the weights that train on it when update_weights_interval is 1 (with N, up to N).
"""

from __future__ import annotations

from infra.cluster.cluster_token import require_cluster_token

# before anything imports Ray (prefect_ray does): Ray reads its auth mode at import
require_cluster_token()

import sys
import time

from prefect import flow

from flows.ahead import GenerateAhead, TrainingAhead
from flows.artifacts import RunArtifacts
from flows.colocation import colocation
from flows.launch import launch
from flows.prefect_on_ray import task_runner
from flows.run_log import log_iteration, log_outputs, log_start, log_startup
from flows.run_start import checked_run, new_system, run_tasks, started_system
from infra import startup
from infra.config import RunConfig
from infra.schedule import LoopSchedule

startup.mark("imports")


@flow(name="train", task_runner=task_runner(), validate_parameters=True)
def train(config: RunConfig = RunConfig()) -> dict:  # noqa: B008 - the UI shows the defaults as a form
    checked = checked_run(config)
    if checked.finished:
        return {"final": {}, "finished": checked.finished}
    tasks = run_tasks(config)
    with started_system(config) as (run, handles):
        start = run.restore()  # next rollout id; the weights hold `start` training iterations
        startup.mark("restore")
        schedule = LoopSchedule.from_config(config, checked.num_train_prompts, start)
        log_start(config, start, schedule.num_rollout)
        report = RunArtifacts(config, start, schedule.num_rollout)
        tasks.sync.submit(handles, start).result()
        startup.mark("first_sync")
        ahead, devices = config.mode == "async", colocation(config, schedule)
        batches = GenerateAhead(lambda k, after: tasks.generate.submit(handles, k, wait_for=after))

        def submit_training(k: int, after: list) -> list:
            # ppo: the critic trains beside the actor; the actor sits out critic-only iterations
            critic = tasks.train_critic.submit(handles, k, wait_for=after) if config.critic.enabled else None
            actor = tasks.train.submit(handles, k, wait_for=after) if schedule.actor_trains(k) else None
            return [f for f in (critic, actor) if f is not None]

        training = TrainingAhead(submit_training)
        batches.submit(start)
        row: dict = {}
        ended = (time.monotonic(), time.time())  # when the last iteration's sync returned
        for k in range(start, schedule.num_rollout):
            # an iteration starts when its training can: now, or as the previous sync ended
            t0, started = ended if training.submitted(k) else (time.monotonic(), time.time())
            rollout = batches.take(k)
            if k == start:
                log_startup(run.record_startup(rollout))
            if ahead and schedule.has_next(k):
                batches.submit(k + 1)
            row = {**rollout, **_train_and_sync(k, run, handles, tasks, devices, schedule, batches, training)}
            ended = (time.monotonic(), time.time())  # a training submitted ahead starts about now
            if schedule.eval_after(k):
                row.update(report.evaluated(k, tasks.evaluate.submit(handles, k).result()))
            row["time_iteration_s"] = time.monotonic() - t0
            row["time_started_unix"] = started  # start to start also counts the save after the row
            run.record(row)  # before the checkpoint: a resumed run never lacks this row
            if schedule.save_after(k):
                batches.drain()  # the batch generated ahead is part of the checkpoint
                # as the seed: the writes overlap the next iterations, except the last save's
                saved = tasks.save.submit(handles, k, schedule.export_hf_after(k), not schedule.is_last(k))
                report.saved(saved.result())
            report.iteration_done(k, row)
            log_iteration(k, row)
        outputs = run.outputs()
    report.finish(outputs)  # table, reward curve, links: after Ray is down
    log_outputs(outputs)
    return {"final": row, **outputs}


def _train_and_sync(k, run, handles, tasks, devices, schedule, batches, training) -> dict:
    """Train on batch k, then sync the weights if the schedule says: the row's fields of both."""
    released = devices.release_engines(run)  # colocated: the trainer gets the devices
    trained = training.take(k)
    # the sync's task run is submitted now; Ray starts it once training and the batch
    # generated ahead are done (no generation may be in flight while weights change),
    # without waiting for this loop. Colocated, the engines first get their devices back.
    in_flight = trained + batches.in_flight()
    synced = tasks.sync.submit(handles, k + 1, wait_for=in_flight) if devices.sync_ahead(k) else None
    # so are the next iteration's training and, where no save or eval comes between, the next
    # generate: behind that sync (flows/ahead.py)
    if devices.train_ahead(k):
        training.submit(k + 1, after=[synced] if synced else in_flight)
    if synced and (upcoming := devices.generate_behind_sync(k)) is not None:
        batches.submit(upcoming, after=[synced])
    row = {**released, "time_train_s": 0.0}
    for future in trained:
        row.update(future.result())
    row.update(devices.resume_engines(run))
    if schedule.sync_after(k) and synced is None:
        batches.drain()  # colocated: nothing generates while the weights change
        synced = tasks.sync.submit(handles, k + 1)
    return {**row, **synced.result()} if synced else row


def main(argv: list[str] | None = None) -> int:
    return launch(train, argv, description=__doc__.split("\n")[0], system=new_system)


if __name__ == "__main__":
    sys.exit(main())
