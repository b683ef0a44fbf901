"""Re-running a run name never mixes two runs, and bad rewards stop a run clearly.

`resume=never` on a used folder fails before Ray starts; `fresh` starts over with one
metrics row per iteration and its own checkpoint; `auto` on a finished run exits at once.
A reward that hangs on most samples times out, and the run stops (generate not retried)
instead of training on zeros.
"""

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

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
REPO = Path(__file__).resolve().parents[2]


def engines_of(tmp_path) -> list[int]:
    """Engine servers of this test's runs (their model lies under tmp_path): the machine may
    run other people's engines at the same time."""
    pids = []
    for p in psutil.process_iter(["pid", "cmdline"]):
        cmd = " ".join(p.info["cmdline"] or [])
        if "infra.engine_server.server" in cmd and str(tmp_path) in cmd:
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


def test_auto_on_a_finished_run_starts_neither_ray_nor_the_api(prefect_api, tmp_path):
    assert train(config(tmp_path), return_state=True).is_completed()
    args = [
        *("run_name=again", "num_rollout=2", "checkpoint.resume=auto", "eval.interval=null"),
        *("rollout.prompts_per_rollout=8", "rollout.n_samples_per_prompt=4", "rollout.startup_timeout_s=600"),
        *(f"storage.uri={tmp_path / 'runs'}", "checkpoint.save_interval=1", "checkpoint.keep_last=1"),
    ]
    # no API configured: the command would start its own server, as a user's first run does
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "RAY_ADDRESS"))}
    env["PREFECT_HOME"] = str(tmp_path / "prefect")
    t0 = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, "-m", "flows.train", *args],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    started: set[str] = set()  # every process the command started, seen every 50 ms
    try:
        while proc.poll() is None:
            with contextlib.suppress(psutil.Error):
                for child in psutil.Process(proc.pid).children(recursive=True):
                    with contextlib.suppress(psutil.Error):
                        started.add(" ".join(child.cmdline()))
            time.sleep(0.05)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    out = proc.communicate()[0]
    assert proc.returncode == 0, out[-3000:]
    assert "run again is already finished" in out and "nothing to do" in out
    assert not [cmd for cmd in started if "raylet" in cmd or "gcs_server" in cmd or "uvicorn" in cmd]
    assert time.monotonic() - t0 < 60
