"""The demo flow on prefect-ray's stock RayTaskRunner (PRL_TASK_RUNNER=stock) learns exactly as
on the fast runner (flows/prefect_on_ray): what the fast runner changes is how task runs get
to Ray and back, never what they compute. Both runs start as `python -m flows.train` starts
one: the run's Ray cluster first, then the flow, whose task runner joins that cluster."""

from __future__ import annotations

import pytest
from prefect_ray import RayTaskRunner

from flows.prefect_on_ray import FastRayTaskRunner, task_runner, worker_env
from flows.train import train
from infra.cluster.ray_cluster import ray_session
from infra.config import RunConfig
from infra.storage.fs import RunStore
from infra.storage.metrics import read_metrics

pytestmark = pytest.mark.flow


# what each iteration learned: the reward, and what the optimizer step saw
LEARNING = ("reward_mean", "reward_std", "loss", "grad_norm", "entropy")


def learning_curves(tmp_path, kind: str) -> dict[str, list[float]]:
    """LEARNING per iteration of a short demo run (same seeds) on the `kind` runner."""
    cfg = RunConfig.model_validate(
        {
            "run_name": "both-ways",
            "num_rollout": 3,  # async: iteration 2 samples from weights trained on iteration 0
            "rollout": {"prompts_per_rollout": 8, "n_samples_per_prompt": 4},
            "storage": {"uri": str(tmp_path / kind)},
            "eval": {"interval": None},
        }
    )
    runner = task_runner(kind)
    with ray_session(cfg, worker_env()):
        state = train.with_options(task_runner=runner)(cfg, return_state=True)
    assert state.is_completed(), state.message
    rows = read_metrics(RunStore(cfg.storage, cfg.run_name))
    assert [r["rollout_id"] for r in rows] == [0, 1, 2]
    return {key: [r[key] for r in rows] for key in LEARNING}


def test_the_stock_runner_learns_the_same_reward_curve_as_the_fast_one(prefect_api, tmp_path):
    assert isinstance(train.task_runner, FastRayTaskRunner)  # the default
    assert type(task_runner("stock")) is RayTaskRunner  # prefect-ray's own, not a subclass
    fast = learning_curves(tmp_path, "fast")
    stock = learning_curves(tmp_path, "stock")
    assert stock["reward_mean"] == fast["reward_mean"]
    assert stock == fast  # to the last bit: the same samples, the same steps
