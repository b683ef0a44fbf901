"""`seed=N` on the command line repeats a run exactly, and another seed gives another run."""

from __future__ import annotations

import pytest

from flows.prefect_on_ray import worker_env
from flows.train import train
from infra.cluster.ray_cluster import ray_session
from infra.config_files import load_config
from infra.storage.fs import RunStore
from infra.storage.metrics import read_metrics

pytestmark = pytest.mark.flow

# what each iteration sampled and learned
LEARNING = ("reward_mean", "reward_std", "response_len_mean", "loss", "grad_norm", "entropy")


def metrics_of(tmp_path, seed: int, folder: str) -> dict[str, list[float]]:
    # the overrides as `python -m flows.train` parses them, the smallest demo the flow tests run
    cfg = load_config(
        None,
        [
            "run_name=seeded",
            "num_rollout=2",  # async: iteration 1 is sampled while iteration 0 trains
            "rollout.prompts_per_rollout=8",
            "rollout.n_samples_per_prompt=4",
            f"storage.uri={tmp_path / folder}",
            "eval.interval=null",
            f"seed={seed}",
        ],
    )
    with ray_session(cfg, worker_env()):
        state = train(cfg, return_state=True)
    assert state.is_completed(), state.message
    rows = read_metrics(RunStore(cfg.storage, cfg.run_name))
    assert [r["rollout_id"] for r in rows] == [0, 1]
    return {key: [r[key] for r in rows] for key in LEARNING}


def test_a_seed_repeats_a_run_and_another_seed_changes_it(prefect_api, tmp_path):
    first = metrics_of(tmp_path, 7, "a")
    again = metrics_of(tmp_path, 7, "b")
    other = metrics_of(tmp_path, 8, "c")
    assert again == first  # to the last bit
    # another model init, prompt order and sampling: the first step already differs
    assert other["entropy"][0] != first["entropy"][0]
