"""The train flow with SGLang's real server as its engines (configs/sglang-cpu.yaml), started
by the project's own engine actors through `rollout.sglang_python`.

One run of 3 async iterations on 2 engines, with the weight check after every broadcast
sync, an eval and a checkpoint; one engine server is SIGKILLed once the first row is in,
and must be restarted, resynced and its requests redone with no sample lost or twice.
Then the run is resumed from its checkpoint onto fresh servers, to 5 iterations, with disk
weight sync.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import pandas as pd
import psutil
import pytest

from flows.train import train
from infra.config_files import load_config
from infra.storage.fs import RunStore
from infra.storage.metrics import read_metrics
from tests.flows import conftest as flow_fixtures
from tests.sglang.servers import assert_no_kernel_calls

pytestmark = [pytest.mark.sglang, pytest.mark.sglang_server, pytest.mark.flow]
prefect_api = flow_fixtures.prefect_api  # the flow tier's API server fixture

REPO = Path(__file__).resolve().parents[2]
PROMPTS, N = 16, 8
LAUNCH = "sglang.launch_server"


def _servers() -> list[psutil.Process]:
    """SGLang servers started under this test process (the engine actors' children)."""
    out = []
    for proc in psutil.Process(os.getpid()).children(recursive=True):
        try:
            if LAUNCH in " ".join(proc.cmdline()):
                out.append(proc)
        except psutil.NoSuchProcess:
            continue
    return out


class ServerWatch(threading.Thread):
    """Records every SGLang server seen during a run; SIGKILLs one once `kill_after_rows`
    metrics rows are in (None: never)."""

    def __init__(self, store: RunStore, kill_after_rows: int | None):
        super().__init__(daemon=True)
        self.store, self.kill_after_rows = store, kill_after_rows
        self.seen: dict[int, str] = {}
        self.killed: list[int] = []
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            servers = _servers()
            for proc in servers:
                self.seen.setdefault(proc.pid, " ".join(proc.cmdline()))
            if self._kill_due(servers):
                servers[0].send_signal(signal.SIGKILL)
                self.killed.append(servers[0].pid)
            time.sleep(0.2)

    def _kill_due(self, servers: list) -> bool:
        if self.kill_after_rows is None or self.killed or not servers:
            return False
        return self.store.exists("metrics.jsonl") and len(read_metrics(self.store)) >= self.kill_after_rows


def _run(cfg, watch: ServerWatch):
    watch.start()
    try:
        return train(cfg, return_state=True)
    finally:
        watch.stop.set()
        watch.join(10)


def _check_rollouts(store: RunStore, versions: dict[int, int]) -> None:
    """Rollout k whole, every sample from the weights of version `versions[k]`."""
    for k, version in versions.items():
        frame = pd.read_parquet(store.uri("rollouts", f"{k:07d}.parquet"))
        assert len(frame) == PROMPTS * N  # nothing lost, nothing twice
        assert (frame.groupby("group").size() == N).all()
        assert set(frame["weight_version"]) == {version}, (k, set(frame["weight_version"]))


def test_flow_on_real_sglang_engines_survives_a_killed_engine_and_resumes(
    prefect_api, sglang_python, tmp_path
):  # noqa: F811
    common = [
        f"storage.uri={tmp_path / 'runs'}",
        f"rollout.sglang_python={sglang_python}",
        f"rollout.prompts_per_rollout={PROMPTS}",
        f"rollout.n_samples_per_prompt={N}",
        "cluster.engines.num_workers=2",
        "cluster.trainer.num_workers=1",
        "rollout.engine_health_timeout_s=20",
        "eval.interval=3",
        "eval.num_prompts=16",
    ]
    cfg = load_config(REPO / "configs" / "sglang-cpu.yaml", [*common, "num_rollout=3"])
    store = RunStore(cfg.storage, cfg.run_name)
    watch = ServerWatch(store, kill_after_rows=1)
    state = _run(cfg, watch)
    assert state.is_completed(), state.message
    assert len(watch.killed) == 1, watch.killed
    # 2 engines, then the killed one's replacement: all SGLang's server, on its CPU path
    assert len(watch.seen) >= 3, watch.seen
    assert all("--device cpu" in cmd for cmd in watch.seen.values())
    rows = read_metrics(store)
    assert [r["rollout_id"] for r in rows] == [0, 1, 2]
    restarts = sum(r.get("engine_restarts", 0) + r.get("sync_engine_restarts", 0) for r in rows)
    assert restarts == 1
    for r in rows:  # every sync, the restored engine's included: engine == trainer weights
        assert r["weights_checked"] > 0 and r["max_abs_diff"] == 0.0, r
    assert "eval_reward_mean" in rows[-1]
    assert store.exists("checkpoints/iter_0000002/COMMITTED")
    # async: rollout k comes from the weights after k-1 training steps
    _check_rollouts(store, {0: 0, 1: 0, 2: 1})

    # resumed from the checkpoint onto fresh servers, with disk sync
    resumed = load_config(
        REPO / "configs" / "sglang-cpu.yaml",
        [*common, "num_rollout=5", "checkpoint.resume=auto", "weight_sync.method=disk"],
    )
    watch = ServerWatch(store, kill_after_rows=None)
    state = _run(resumed, watch)
    assert state.is_completed(), state.message
    assert watch.seen and not set(watch.seen) & set(watch.killed)
    rows = read_metrics(store)
    assert [r["rollout_id"] for r in rows] == [0, 1, 2, 3, 4]
    for r in rows[3:]:
        assert r["weights_checked"] > 0 and r["max_abs_diff"] == 0.0, r
    # the resumed run's first rollout comes from the restored weights, the next one step behind
    _check_rollouts(store, {3: 3, 4: 3})
    assert _servers() == []  # no engine server outlives its run
    assert_no_kernel_calls()
