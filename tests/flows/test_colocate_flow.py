"""Colocated mode end to end (sync mode): engines share the trainer's placement bundles,
release their weights while the trainer trains and resume them before each weight sync."""

import pandas as pd
import psutil
import pytest

from infra.storage.fs import RunStore
from infra.storage.metrics import read_metrics
from tests.flows.conftest import engine_server_pids
from tests.flows.test_train_flow import run_flow, small_config

pytestmark = pytest.mark.flow


def test_colocated_sync_flow(prefect_api, tmp_path):
    cfg = small_config(
        tmp_path,
        mode="sync",
        num_rollout=3,
        cluster={"colocate": True},
        eval={"interval": 2, "num_prompts": 8, "n_samples": 2, "pass_k": [1, 2]},
    )
    _, runs = run_flow(cfg)
    assert {"train-0002", "sync-0003", "eval-0001"} <= set(runs)
    store = RunStore(cfg.storage, cfg.run_name)
    rows = read_metrics(store)
    assert [r["rollout_id"] for r in rows] == [0, 1, 2]
    for row in rows:
        # every iteration released the engine before training and resumed it after
        assert row["time_engine_release_s"] >= 0 and row["time_engine_resume_s"] >= 0
        assert row["weights_checked"] > 0  # after resume + sync, engine == trainer
    for k in range(3):
        frame = pd.read_parquet(store.uri("rollouts", f"{k:07d}.parquet"))
        assert set(frame["weight_version"]) == {k}  # on-policy: sampled after the sync of k-1
    # this run's engine servers (their model path lies under tmp_path) are gone
    assert not [
        pid for pid in engine_server_pids() if str(tmp_path) in " ".join(psutil.Process(pid).cmdline())
    ]
