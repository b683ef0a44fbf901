"""A rollout reaches the trainer ranks when it is made, not with the train call that
follows the weight sync (infra/trainer/batch_inbox.py): the whole system on a local Ray
cluster (no Prefect), two FSDP2 ranks over gloo."""

from __future__ import annotations

import math
import time

import pytest
import ray

from infra.config import RunConfig
from infra.system import RLSystem

pytestmark = pytest.mark.dist


def _states(run) -> list[dict]:
    return ray.get([t.inbox_state.remote() for t in run.trainers])


def test_ranks_train_on_the_batch_staged_by_generate_and_fetch_one_never_staged(tmp_path):
    cfg = RunConfig.model_validate(
        {
            "run_name": "staging",
            "rollout": {"prompts_per_rollout": 4, "n_samples_per_prompt": 2},
            "storage": {"uri": str(tmp_path)},
        }
    )
    with RLSystem(cfg) as run:
        assert len(run.trainers) == 2
        run.sync(0)
        run.generate(0)
        deadline = time.monotonic() + 60
        while not all(0 in s["held"] for s in _states(run)):  # staged beside the ranks' main thread
            assert time.monotonic() < deadline, _states(run)
            time.sleep(0.05)
        staged = run.train(0)
        assert [(s["staged"], s["fetched"]) for s in _states(run)] == [(1, 0), (1, 0)]

        ray.get(run.manager.generate.remote(1))  # made, never staged: each rank fetches it
        fetched = run.train(1)
        assert [(s["staged"], s["fetched"]) for s in _states(run)] == [(1, 1), (1, 1)]
        assert [s["held"] for s in _states(run)] == [[0, 1], [0, 1]]  # two at most

    for metrics in (staged, fetched):
        assert math.isfinite(metrics["loss"]) and metrics["num_steps"] == 1 and metrics["response_tokens"] > 0
        assert 0 <= metrics["time_batch_wait_s"] < metrics["time_train_s"] + 5
