"""The pipeline's stages besides RL, each a Prefect flow of its own (flows/pipeline.py runs
them as subflows): `sft`, supervised fine-tuning on the trainer ranks RL uses, and
`evaluate_model`, held-out evaluation of a model on the rollout engines."""

from __future__ import annotations

from prefect import flow, get_run_logger

from flows.prefect_on_ray import task_runner, worker_env
from flows.results import persisted
from flows.run_start import started
from infra.config import RunConfig
from infra.sft_stage import begin_sft, finished_sft
from tasks.evaluate import evaluate
from tasks.sft import sft as sft_epoch
from tasks.sft import sft_export

# What a control worker imports for the stages' task runs, while the actors start.
WORKER_IMPORTS = [
    "prefect.task_engine",
    "prefect.client.orchestration",
    "prefect_ray.task_runners",
    "tasks.sft",
    "tasks.evaluate",
]


@flow(name="sft", task_runner=task_runner(), validate_parameters=True)
def sft(config: RunConfig = RunConfig()) -> dict:  # noqa: B008 - the UI shows the defaults as a form
    """Fine-tune config.model.path on the labelled rows (the `sft` section) for sft.epochs
    epochs and write the model to <run>/sft/hf/. Skipped when a stage with the same settings
    finished (infra/sft_stage.py); the answer then says `skipped`."""
    from infra.stage_systems import SFTSystem  # noqa: PLC0415 - torch & co, as flows/run_start.py

    log = get_run_logger()
    done = finished_sft(config)
    if done is not None:
        log.info("SFT already done with these settings: %s", done["hf_export_uri"])
        return {**done, "skipped": True}
    begin_sft(config)
    epoch_task, export_task = persisted(config, sft_epoch, sft_export)
    with started(SFTSystem(config, worker_env(), WORKER_IMPORTS)) as (run, handles):
        log.info(
            "sft: %(examples)d labelled examples (%(dropped)d dropped, %(eval_prompts_left_out)d left out "
            "as eval prompts), %(steps_per_epoch)d steps an epoch",
            run.plan,
        )
        metrics: dict = {}
        for epoch in range(config.sft.epochs):
            metrics = epoch_task.submit(handles, epoch).result()
        done = export_task.submit(handles, metrics).result()
    log.info("sft: loss %.4f, answer accuracy %.3f", metrics["loss"], metrics["answer_accuracy"])
    return {**done, "skipped": False}


@flow(name="eval", task_runner=task_runner(), validate_parameters=True)
def evaluate_model(config: RunConfig = RunConfig()) -> dict:  # noqa: B008 - as sft
    """Evaluate config.model.path on the eval sets (config.eval), as the RL loop's evals do."""
    from infra.stage_systems import EvalSystem  # noqa: PLC0415 - as sft

    (eval_task,) = persisted(config, evaluate)
    with started(EvalSystem(config, worker_env(), WORKER_IMPORTS)) as (_, handles):
        result = eval_task.submit(handles, 0).result()
    get_run_logger().info("eval of %s: reward %.3f", config.model.path, result["eval_reward_mean"])
    return result
