"""Post-training as one Prefect flow: supervised fine-tuning, RL from the fine-tuned model,
held-out evaluation. Each stage is a subflow run of its own (its task runs, logs and state in
the UI), and a re-run of the pipeline resumes where the stages left off:

    sft    (flows/stages.py)  labelled rows -> <run>/sft/hf/; skipped when done with these settings
    eval                      held-out accuracy of the fine-tuned model
    rl     (flows/train.py)   the RL loop from model.path=<run>/sft/hf/; checkpoint.resume applies
    eval                      held-out accuracy of the RL run's final model, <run>/hf/latest/

and writes what it returns to <run>/pipeline.json.

    python -m flows.pipeline --config configs/addition.yaml [key.path=value ...]
"""

from __future__ import annotations

from infra.cluster.cluster_token import require_cluster_token

# before anything imports Ray (prefect_ray does): Ray reads its auth mode at import
require_cluster_token()

import json
import sys

from prefect import flow, get_run_logger

from flows.launch import launch
from flows.prefect_on_ray import worker_env
from flows.stages import evaluate_model, sft
from flows.train import train
from infra.cluster.ray_cluster import ray_session
from infra.config import RunConfig
from infra.sft_stage import check_pipeline, rl_config
from infra.storage.fs import RunStore

SUMMARY = "pipeline.json"  # in the run folder: what the pipeline returns


@flow(name="pipeline", validate_parameters=True)
def pipeline(config: RunConfig = RunConfig()) -> dict:  # noqa: B008 - the UI shows the defaults as a form
    check_pipeline(config)
    name = config.run_name
    # one Ray cluster for every stage: the command's, or one started here
    with ray_session(config, worker_env()):
        warm = sft.with_options(flow_run_name=f"{name}-sft")(config)
        rl = rl_config(config, warm["hf_export_uri"])
        after_sft = evaluate_model.with_options(flow_run_name=f"{name}-eval-sft")(rl)
        trained = train.with_options(flow_run_name=f"{name}-rl")(rl)
        final = rl_config(config, RunStore(config.storage, name).uri("hf", "latest"))
        after_rl = evaluate_model.with_options(flow_run_name=f"{name}-eval-rl")(final)
    summary = {
        "sft": warm,
        "rl": trained,
        "eval_after_sft": after_sft["eval_reward_mean"],
        "eval_after_rl": after_rl["eval_reward_mean"],
    }
    RunStore(config.storage, name).write_text(SUMMARY, json.dumps(summary, indent=1, default=str))
    get_run_logger().info(
        "held-out reward: %.3f after SFT%s, %.3f after RL",
        summary["eval_after_sft"],
        " (SFT stage skipped: done before)" if warm["skipped"] else "",
        summary["eval_after_rl"],
    )
    return summary


def main(argv: list[str] | None = None) -> int:
    # the RL stage's own check of a finished run comes after SFT and its eval, inside the flow
    return launch(pipeline, argv, __doc__.split("\n")[0], prog="python -m flows.pipeline", finished=None)


if __name__ == "__main__":
    sys.exit(main())
