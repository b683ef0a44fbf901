"""Engine faults with real processes: an engine server is SIGKILLed while the run goes on.

The rollout manager notices (a dropped request or a silent /health), its EngineActor
starts a new server, the weight-update group is rebuilt over every engine and the new
server gets the last pushed weights with their version; the failed engine's requests run
again with the same seeds. The run must end with one metrics row per iteration and every
rollout whole: no sample lost, none twice, each labelled with the weights it came from.
"""

from __future__ import annotations

import os
import signal
import threading
import time

import pandas as pd
import psutil
import pytest

from flows.train import train
from infra.config import RunConfig
from infra.storage.fs import RunStore
from infra.storage.metrics import read_metrics
from tests.flows.conftest import engine_server_pids

pytestmark = pytest.mark.flow
PROMPTS, N = 16, 8


def my_engine_servers() -> list[psutil.Process]:
    """Engine servers started by this test process (never another user's)."""
    me = psutil.Process(os.getpid())
    return [
        p for p in me.children(recursive=True) if "infra.engine_server.server" in " ".join(p.cmdline() or [])
    ]


class EngineKiller(threading.Thread):
    """SIGKILLs the engine server once the metrics file has `after_rows` rows, per entry."""

    def __init__(self, store: RunStore, after_rows: list[int]):
        super().__init__(daemon=True)
        self.store, self.after_rows = store, after_rows
        self.killed: list[tuple[int, float]] = []  # (pid, monotonic time)
        self.stop = threading.Event()

    def run(self) -> None:
        for rows in self.after_rows:
            while not self.stop.is_set():
                if self.store.exists("metrics.jsonl") and len(read_metrics(self.store)) >= rows:
                    break
                time.sleep(0.05)
            servers = my_engine_servers()
            if self.stop.is_set() or not servers:
                return
            servers[0].send_signal(signal.SIGKILL)
            self.killed.append((servers[0].pid, time.monotonic()))


@pytest.mark.parametrize("method", ["broadcast", "disk"])
def test_killed_engine_is_restarted_and_the_run_loses_nothing(prefect_api, tmp_path, method):
    cfg = RunConfig.model_validate(
        {
            "run_name": "enginekill",
            "mode": "async",
            "num_rollout": 4,
            "rollout": {
                "prompts_per_rollout": PROMPTS,
                "n_samples_per_prompt": N,
                "sampling": {"max_new_tokens": 12},
                "engine_health_timeout_s": 10,
            },
            "weight_sync": {"method": method, "check_weight_update_equal": True, "timeout_s": 30},
            "storage": {"uri": str(tmp_path / "runs")},
            "checkpoint": {"save_interval": None},
            "eval": {"interval": None},
        }
    )
    store = RunStore(cfg.storage, cfg.run_name)
    killer = EngineKiller(store, after_rows=[1, 3])
    killer.start()
    t0 = time.monotonic()
    try:
        state = train(cfg, return_state=True)
    finally:
        killer.stop.set()
        killer.join(5)
    assert state.is_completed(), state.message
    assert len(killer.killed) == 2, killer.killed
    print(f"faults injected: {len(killer.killed)}, run took {time.monotonic() - t0:.1f}s")

    rows = read_metrics(store)
    assert [r["rollout_id"] for r in rows] == [0, 1, 2, 3]  # one row per iteration
    restarts = sum(r.get("engine_restarts", 0) + r.get("sync_engine_restarts", 0) for r in rows)
    assert restarts == 2, [(r.get("engine_restarts"), r.get("sync_engine_restarts")) for r in rows]
    for r in rows:  # after every sync, restored engines included, engine == trainer weights
        assert r["weights_checked"] > 0 and r["max_abs_diff"] == 0.0
    for k in range(4):
        frame = pd.read_parquet(store.uri("rollouts", f"{k:07d}.parquet"))
        assert len(frame) == PROMPTS * N  # nothing lost, nothing twice
        assert (frame.groupby("group").size() == N).all()
        # async: rollout k was generated with the weights after k-1 training steps
        assert set(frame["weight_version"]) == {max(0, k - 1)}, (k, set(frame["weight_version"]))
    assert engine_server_pids() == [] or my_engine_servers() == []
