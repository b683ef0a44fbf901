"""The train flow end to end: real Prefect API, local Ray, 2 FSDP2 gloo ranks, one engine."""

import asyncio

import pandas as pd
import pytest
import ray
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId, LogFilter, LogFilterTaskRunId

from flows.train import train
from infra.config import RunConfig
from infra.storage.fs import RunStore
from infra.storage.metrics import read_metrics
from tests.flows.conftest import engine_server_pids

pytestmark = pytest.mark.flow


def small_config(tmp_path, **over) -> RunConfig:
    tree = {
        "run_name": "it",
        "num_rollout": 4,
        # long enough responses that a rollout takes a measurable time to overlap with
        "rollout": {"prompts_per_rollout": 16, "n_samples_per_prompt": 8, "sampling": {"max_new_tokens": 12}},
        "weight_sync": {"check_weight_update_equal": True},
        "storage": {"uri": str(tmp_path / "runs")},
        "checkpoint": {"save_interval": 2},
        "eval": {"interval": 3, "num_prompts": 8, "n_samples": 2, "pass_k": [1, 2]},
    }
    tree.update(over)
    return RunConfig.model_validate(tree)


async def _task_runs(flow_run_id):
    async with get_client() as client:
        runs = await client.read_task_runs(
            flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id]))
        )
    return {r.name: r for r in runs}


async def _logs(task_run_id) -> list[str]:
    async with get_client() as client:
        logs = await client.read_logs(
            log_filter=LogFilter(task_run_id=LogFilterTaskRunId(any_=[task_run_id]))
        )
    return [log.message for log in logs]


def run_flow(cfg):
    state = train(cfg, return_state=True)
    assert state.is_completed(), state.message
    runs = asyncio.run(_task_runs(state.state_details.flow_run_id))
    return state, runs


def overlaps(a, b) -> bool:
    return a.start_time < b.end_time and b.start_time < a.end_time


def test_async_flow_overlaps_and_keeps_engines_in_sync(prefect_api, tmp_path):
    cfg = small_config(tmp_path)
    state, runs = run_flow(cfg)

    for k in range(4):
        for name in ("generate", "train"):
            assert runs[f"{name}-{k:04d}"].state.is_completed()
    # generation of k+1 ran while the trainer trained on k. Iteration 0 is left out: its
    # train task is the first on a fresh Ray worker, whose Prefect start-up (seconds on a
    # loaded 2-core machine) can outlast a tiny generation.
    for k in (1, 2):
        gen, trn = runs[f"generate-{k + 1:04d}"], runs[f"train-{k:04d}"]
        assert overlaps(gen, trn), (k, gen.start_time, gen.end_time, trn.start_time, trn.end_time)
    assert {"save-0001", "save-0003", "eval-0002", "sync-0000", "sync-0004"} <= set(runs)
    # no generation or training while weights change: every generate and train task run
    # lies wholly before or after every sync after the first
    for v in range(1, 5):
        for name, r in runs.items():
            if name.startswith(("generate-", "train-")):
                assert not overlaps(r, runs[f"sync-{v:04d}"]), (name, v)
    # the training of iterations 1 and 3 was submitted behind the syncs of 0 and 2 (the flow
    # had not read them yet); iteration 2 comes after the save of 1, so it was not
    for k, ahead in ((1, True), (2, False), (3, True)):
        upstream = {i.id for i in runs[f"train-{k:04d}"].task_inputs.get("wait_for", [])}
        assert (runs[f"sync-{k:04d}"].id in upstream) == ahead, (k, upstream)
        assert runs[f"train-{k:04d}"].start_time >= runs[f"sync-{k:04d}"].end_time
    # so was the generate of 2 behind the sync of 1 (iteration 0 neither saves nor evaluates);
    # the generate of 3 was not (iteration 1 saves)
    for k, ahead in ((2, True), (3, False)):
        upstream = {i.id for i in runs[f"generate-{k:04d}"].task_inputs.get("wait_for", [])}
        assert (runs[f"sync-{k - 1:04d}"].id in upstream) == ahead, (k, upstream)

    store = RunStore(cfg.storage, cfg.run_name)
    rows = read_metrics(store)
    assert [r["rollout_id"] for r in rows] == [0, 1, 2, 3]
    for r in rows:
        for key in ("reward_mean", "time_generate_s", "time_train_s", "time_sync_s", "time_iteration_s"):
            assert key in r
        # after each sync every engine tensor equalled the trainer's
        assert r["weights_checked"] > 0 and r["max_abs_diff"] == 0.0
    assert "eval_reward_mean" in rows[2] and "eval_pass@2" in rows[2]

    for k in range(4):
        frame = pd.read_parquet(store.uri("rollouts", f"{k:07d}.parquet"))
        assert len(frame) == 16 * 8
        assert frame["weight_version"].notna().all()
        # one step off-policy: rollout k was sampled by the weights after training k-2
        assert set(frame["weight_version"]) == {max(0, k - 1)}
        assert (frame["response_ids"].map(len) == frame["engine_logprobs"].map(len)).all()

    assert store.exists("checkpoints/iter_0000003/COMMITTED")
    # save-0001 went to the background; train-0002 committed it once the ranks' writes were
    # durable; save-0003, the last, was written and committed before its task returned
    assert any("writing in the background" in m for m in asyncio.run(_logs(runs["save-0001"].id)))
    assert "checkpoint of iteration 1 written and committed" in asyncio.run(_logs(runs["train-0002"].id))
    assert store.exists("checkpoints/iter_0000001/COMMITTED")
    assert any(
        m.endswith("committed (" + m.rsplit("(", 1)[-1]) for m in asyncio.run(_logs(runs["save-0003"].id))
    )
    assert store.ls("prefect-results")  # task results persisted beside the run
    assert not ray.is_initialized()
    assert engine_server_pids() == []


def test_sync_mode_does_not_overlap(prefect_api, tmp_path):
    cfg = small_config(tmp_path, mode="sync", num_rollout=2, eval={"interval": None})
    _, runs = run_flow(cfg)
    assert runs["generate-0001"].start_time >= runs["train-0000"].end_time
    frame = pd.read_parquet(RunStore(cfg.storage, cfg.run_name).uri("rollouts", "0000001.parquet"))
    assert set(frame["weight_version"]) == {1}  # on-policy: sampled after the sync of iteration 0


def test_failure_disposes_everything(prefect_api, tmp_path):
    cfg = small_config(tmp_path, data={"reward": "no_such_module:reward"})
    state = train(cfg, return_state=True)
    assert state.is_failed()
    assert "no_such_module" in str(state.message) or "no_such_module" in repr(
        state.result(raise_on_failure=False)
    )
    assert not ray.is_initialized()
    assert engine_server_pids() == []
