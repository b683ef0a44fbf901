"""update_weights_interval=2 in async mode: engines sample with weights up to 2 optimizer
steps old, syncs run every 2 iterations (and at the end), and a resumed run's first sync
puts the checkpoint's weights on the engines."""

import asyncio
import json
import re

import pandas as pd
import pytest
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId, LogFilter, LogFilterTaskRunId

from flows.train import train
from infra.config_files import load_config
from infra.storage.fs import RunStore
from infra.storage.metrics import read_metrics

pytestmark = pytest.mark.flow
SYNC_LOG = re.compile(
    r"engines at weight version (\d+) in [\d.]+s, (\d+) tensors checked \(max abs diff (\S+)\)"
)


async def _sync_logs(flow_run_id) -> dict[str, list[str]]:
    async with get_client() as client:
        runs = await client.read_task_runs(
            flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id]))
        )
        syncs = {r.name: r.id for r in runs if r.name.startswith("sync-")}
        return {
            name: [
                log.message
                for log in await client.read_logs(
                    log_filter=LogFilter(task_run_id=LogFilterTaskRunId(any_=[id_]))
                )
            ]
            for name, id_ in syncs.items()
        }


def versions(store: RunStore, k: int) -> set[int]:
    return set(pd.read_parquet(store.uri("rollouts", f"{k:07d}.parquet"))["weight_version"])


def test_interval_two_lags_two_steps_and_resume_resyncs(prefect_api, tmp_path):
    data = tmp_path / "prompts.jsonl"
    # 64 prompts: no epoch ends within 6 iterations of 8, so only the run's end saves
    data.write_text(
        "".join(json.dumps({"q": f"{i % 10}{i // 10}:", "a": str(i % 10)}) + "\n" for i in range(64))
    )
    args = [
        "run_name=interval",
        "mode=async",
        "update_weights_interval=2",
        f"storage.uri={tmp_path / 'runs'}",
        f"data.train_path={data}",
        "data.prompt_key=q",
        "data.label_key=a",
        "rollout.prompts_per_rollout=8",
        "rollout.n_samples_per_prompt=4",
        "rollout.sampling.max_new_tokens=2",
        "checkpoint.save_interval=null",
        "eval.interval=null",
        "weight_sync.check_weight_update_equal=true",
    ]
    first = load_config(None, [*args, "num_rollout=4"])
    assert train(first, return_state=True).is_completed()
    store = RunStore(first.storage, "interval")
    assert store.exists("checkpoints/iter_0000003/COMMITTED")

    # Engines start at version 0 and the sync after iteration k sets version k+1, after 2 and
    # 4 steps here. Rollout 2 is generated ahead during iteration 1, before that iteration's
    # sync (which waits for it), so it still has version 0; rollout 3 is generated after it.
    assert [versions(store, k) for k in range(4)] == [{0}, {0}, {0}, {2}]
    # sampled at most update_weights_interval steps behind the weights that train on it
    assert max(k - min(versions(store, k)) for k in range(4)) == 2

    rows = read_metrics(store)
    assert [r["rollout_id"] for r in rows] == [0, 1, 2, 3]
    synced = [r["rollout_id"] for r in rows if "time_sync_s" in r]
    assert synced == [1, 3]
    for r in rows:
        if r["rollout_id"] in synced:
            assert r["engine_weight_version"] == r["rollout_id"] + 1
            assert r["weights_checked"] > 0 and r["max_abs_diff"] == 0.0
        else:
            assert "weights_checked" not in r and "engine_weight_version" not in r

    resumed_cfg = load_config(None, [*args, "num_rollout=6", "checkpoint.resume=auto"])
    state = train(resumed_cfg, return_state=True)
    assert state.is_completed()
    rows = read_metrics(store)
    assert [r["rollout_id"] for r in rows] == list(range(6))
    # the resume's first sync (version 4: the checkpoint's weights, 4 steps) was checked
    # tensor by tensor against the restored trainer, and it is the only sync before the end
    logs = asyncio.run(_sync_logs(state.state_details.flow_run_id))
    assert set(logs) == {"sync-0004", "sync-0006"}
    found = [m.groups() for m in map(SYNC_LOG.search, logs["sync-0004"]) if m]
    assert found  # once, or once per attempt if the task was retried
    for version, tensors, diff in found:
        assert int(version) == 4 and int(tensors) > 0 and float(diff) == 0.0
    # both resumed rollouts were sampled by the checkpoint's weights
    assert [versions(store, k) for k in (4, 5)] == [{4}, {4}]
    assert [r["rollout_id"] for r in rows[4:] if "time_sync_s" in r] == [5]
    assert rows[5]["engine_weight_version"] == 6
    assert rows[5]["weights_checked"] > 0 and rows[5]["max_abs_diff"] == 0.0
