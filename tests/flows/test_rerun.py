"""Re-running a run name never mixes two runs, and bad rewards stop a run clearly.

`resume=never` on a used folder fails before Ray starts; `fresh` starts over with one
metrics row per iteration and its own checkpoint; `auto` on a finished run exits at once.
A reward that hangs on most samples times out, and the run stops (generate not retried)
instead of training on zeros.
"""

import asyncio
import time

import psutil
import pytest
import ray
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

from flows.train import train
from infra.config import RunConfig
from infra.storage.checkpoints import CheckpointStore
from infra.storage.fs import RunStore
from infra.storage.metrics import read_metrics
from tests.config_tree import set_paths

pytestmark = pytest.mark.flow


def engines_of(tmp_path) -> list[int]:
    """Engine servers of this test's runs (their model lies under tmp_path): the machine may
    run other people's engines at the same time."""
    pids = []
    for p in psutil.process_iter(["pid", "cmdline"]):
        cmd = " ".join(p.info["cmdline"] or [])
        if "infra.rollout.server" in cmd and str(tmp_path) in cmd:
            pids.append(p.info["pid"])
    return pids


def hanging_reward(prompt: str, response: str, label: str, **kw) -> float:
    time.sleep(30)  # far past the timeout, on every sample
    return 1.0


def config(tmp_path, **over) -> RunConfig:
    tree = {
        "run_name": "again",
        "num_rollout": 2,
        # a generous start-up: engines start slowly on a loaded machine
        "rollout": {"prompts_per_rollout": 8, "n_samples_per_prompt": 4, "startup_timeout_s": 600},
        "storage": {"uri": str(tmp_path / "runs")},
        "checkpoint": {"save_interval": 1, "keep_last": 1},
        "eval": {"interval": None},
    }
    set_paths(tree, over)
    return RunConfig.model_validate(tree)


def run_id_of_latest(store: RunStore) -> str:
    ckpts = CheckpointStore(store, keep_last=None)
    return ckpts.meta(ckpts.latest())["run_id"]


async def _task_runs(flow_run_id) -> dict:
    async with get_client() as client:
        runs = await client.read_task_runs(
            flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id]))
        )
    return {r.name: r for r in runs}


@pytest.mark.timeout(1800)  # three flow runs; minutes each on a loaded 2-core machine
def test_rerun_never_refuses_fresh_restarts_auto_sees_finished(prefect_api, tmp_path):
    first = train(config(tmp_path), return_state=True)
    assert first.is_completed(), first.message
    store = RunStore(config(tmp_path).storage, "again")
    first_run = run_id_of_latest(store)

    t0 = time.monotonic()
    refused = train(config(tmp_path), return_state=True)
    assert refused.is_failed()
    message = str(refused.result(raise_on_failure=False))
    assert "already holds outputs" in message and "checkpoint.resume=fresh" in message
    assert time.monotonic() - t0 < 60 and not ray.is_initialized()
    assert [r["rollout_id"] for r in read_metrics(store)] == [0, 1]

    fresh = train(config(tmp_path, checkpoint__resume="fresh"), return_state=True)
    assert fresh.is_completed(), fresh.message
    assert [r["rollout_id"] for r in read_metrics(store)] == [0, 1]  # no duplicated rows
    assert run_id_of_latest(store) != first_run  # the checkpoint reported is this run's

    t0 = time.monotonic()
    done = train(config(tmp_path, checkpoint__resume="auto"), return_state=True)
    assert done.is_completed()
    assert "already finished" in done.result()["finished"]
    assert time.monotonic() - t0 < 60 and not ray.is_initialized()
    assert engines_of(tmp_path) == []


@pytest.mark.timeout(1200)
def test_hanging_reward_times_out_and_stops_the_run(prefect_api, tmp_path):
    cfg = config(
        tmp_path,
        run_name="hang",
        data__reward=f"{__name__}:hanging_reward",
        data__reward_timeout_s=0.5,
    )
    t0 = time.monotonic()
    state = train(cfg, return_state=True)
    assert state.is_failed()
    message = str(state.result(raise_on_failure=False))
    assert "samples failed their reward" in message and "reward_timeout_s=0.5" in message
    runs = asyncio.run(_task_runs(state.state_details.flow_run_id))
    # a deterministic error: generate ran once, no retries, and nothing trained
    assert runs["generate-0000"].run_count == 1, runs["generate-0000"].run_count
    assert not any(name.startswith("train-") for name in runs)
    assert time.monotonic() - t0 < 300
    assert not ray.is_initialized()
    assert engines_of(tmp_path) == []
    store = RunStore(cfg.storage, "hang")
    assert read_metrics(store) == [] and CheckpointStore(store, keep_last=None).latest() is None
