"""Exact resume: 6 iterations straight against 3, a killed flow process, and 3 resumed.

Sync mode resumes at an epoch boundary (an epoch is 3 iterations here); async mode
resumes mid-epoch, with the batch that was generated ahead taken from its parquet.
"""

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import ray
from safetensors.torch import load_file

from flows.train import train
from infra.config import RunConfig
from infra.storage.fs import RunStore
from infra.storage.metrics import read_metrics
from tests.flows.conftest import engine_server_pids

pytestmark = pytest.mark.flow
REPO = Path(__file__).resolve().parents[2]


def write_prompts(path: Path, n: int) -> str:
    rows = [{"q": f"{i % 10}{i // 10}:", "a": str(i % 10)} for i in range(n)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def overrides(tmp_path: Path, run_name: str, mode: str, num_prompts: int) -> list[str]:
    data = write_prompts(tmp_path / "prompts.jsonl", num_prompts)
    return [
        f"run_name={run_name}",
        f"mode={mode}",
        "num_rollout=6",
        f"storage.uri={tmp_path / 'runs'}",
        f"data.train_path={data}",
        f"data.eval_path={data}",
        "data.prompt_key=q",
        "data.label_key=a",
        "rollout.prompts_per_rollout=8",
        "rollout.n_samples_per_prompt=4",
        "rollout.sampling.max_new_tokens=2",
        "checkpoint.save_interval=3",
        "checkpoint.keep_last=3",
        "eval.interval=null",
    ]


def config(args: list[str], **extra: str) -> RunConfig:
    from infra.config_files import load_config

    return load_config(None, args + [f"{k}={v}" for k, v in extra.items()])


def run_and_kill_after(args: list[str], store: RunStore, rollout_id: int, api_url: str, log: Path) -> None:
    """Run the flow CLI and SIGKILL its whole process tree once checkpoint `rollout_id` is committed."""
    # the test's own API: the CLI would otherwise start a server on the user's Prefect home
    env = {**os.environ, "PREFECT_API_URL": api_url}
    with log.open("w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "flows.train", *args],
            cwd=REPO,
            env=env,
            start_new_session=True,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    marker = f"checkpoints/iter_{rollout_id:07d}/COMMITTED"
    deadline = time.monotonic() + 300
    try:
        while not store.exists(marker):
            if proc.poll() is not None:
                raise AssertionError(
                    f"flow exited ({proc.returncode}) before checkpoint {rollout_id}:\n{log.read_text()[-3000:]}"
                )
            assert time.monotonic() < deadline, "no checkpoint within 300 s"
            time.sleep(0.2)
    finally:
        with contextlib.suppress(ProcessLookupError):  # already gone if it failed
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def comparable(row: dict) -> dict:
    # timings and locations differ between two runs by nature; everything else must not
    return {k: v for k, v in row.items() if not k.startswith("time_") and not k.endswith("_uri")}


def final_weights(store: RunStore) -> dict:
    return load_file(store.uri("hf", "latest", "model.safetensors"))


@pytest.mark.parametrize(
    ("mode", "num_prompts"),
    [("sync", 24), ("async", 32)],  # sync: epoch = 3 iterations (boundary); async: 4 (mid-epoch)
)
def test_killed_and_resumed_run_matches_straight_run(prefect_api, tmp_path, mode, num_prompts):
    straight_cfg = config(overrides(tmp_path, "straight", mode, num_prompts))
    assert train(straight_cfg, return_state=True).is_completed()
    straight = RunStore(straight_cfg.storage, "straight")

    args = overrides(tmp_path, "resumed", mode, num_prompts)
    resumed = RunStore(straight_cfg.storage, "resumed")
    run_and_kill_after(args, resumed, 2, prefect_api, tmp_path / "killed-run.log")
    # no orphan engine may outlive the killed flow (they die with their Ray actor)
    deadline = time.monotonic() + 30
    while engine_server_pids() and time.monotonic() < deadline:
        time.sleep(0.5)
    assert engine_server_pids() == []

    assert train(config(args, **{"checkpoint.resume": "auto"}), return_state=True).is_completed()
    assert not ray.is_initialized()

    rows_straight, rows_resumed = read_metrics(straight), read_metrics(resumed)
    assert [r["rollout_id"] for r in rows_resumed] == list(range(6))  # no duplicated rows
    for a, b in zip(rows_straight[3:], rows_resumed[3:], strict=True):
        assert comparable(a) == comparable(b)
    wa, wb = final_weights(straight), final_weights(resumed)
    assert wa.keys() == wb.keys()
    for name in wa:
        assert (wa[name] == wb[name]).all(), name


def test_nightly_runs_continue_and_a_foreign_checkpoint_is_refused(prefect_api, tmp_path):
    # what the nightly deployment does: a fixed run name, resume=auto, a slice per run
    args = overrides(tmp_path, "nightly", "sync", 24) + [
        "num_rollout=2",
        "iterations_per_run=1",
        "checkpoint.resume=auto",
    ]
    for _ in range(2):
        assert train(config(args), return_state=True).is_completed()
    store = RunStore(config(args).storage, "nightly")
    assert [r["rollout_id"] for r in read_metrics(store)] == [0, 1]
    assert store.exists("checkpoints/iter_0000000/COMMITTED")  # the first night's stop
    assert store.exists("checkpoints/iter_0000001/COMMITTED")

    other = config(args, **{"algorithm.lr": "0.1"})
    state = train(other, return_state=True)
    assert state.is_failed()
    assert "another model/data/rollout/algorithm" in str(state.result(raise_on_failure=False))
    assert engine_server_pids() == []
