"""The command's early start (flows/early_start.py): a system it began reaches the flow run of
the same config only, once; one the flow never took is stopped; a failed preflight starts
nothing; a failed start is the flow's error and leaves nothing running."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from flows import early_start
from infra.config import RunConfig


class RecordingSystem:
    """Stands in for RLSystem where only the handoff is under test: what was called, and when."""

    def __init__(self, fail: Exception | None = None) -> None:
        self.fail = fail
        self.calls: list[str] = []
        self.release = threading.Event()
        self.placement = {"trainer": ["node"]}
        self.pids = {"trainer_ranks": [1]}

    def start(self) -> str:
        self.calls.append("start")
        self.release.wait(10)
        if self.fail is not None:
            raise self.fail
        return "handles"

    def dispose(self) -> None:
        self.calls.append("dispose")
        self.release.set()  # as RLSystem's: killed actors end a start waiting on them


def config(tmp_path: Path, **changes) -> RunConfig:
    return RunConfig.model_validate({"storage": {"uri": str(tmp_path / "runs")}, "run_name": "r", **changes})


def test_the_flow_of_the_same_config_takes_the_started_system(tmp_path):
    cfg, system = config(tmp_path), RecordingSystem()
    early = early_start.begin(cfg, system)
    try:
        assert early is not None and early.checked.num_train_prompts > 0
        assert early_start.pending(config(tmp_path, run_name="other")) is None
        assert early_start.preflight_of(cfg) is early.checked  # the preflight is not run twice
        taken = early_start.pending(cfg)
        assert taken is early
        system.release.set()
        with taken as handles:
            assert handles == "handles"
            assert early_start.pending(cfg) is None  # once
        assert system.calls == ["start", "dispose"]
    finally:
        early_start.end(early)
    assert system.calls == ["start", "dispose"]  # the flow stopped it; the command leaves it be
    assert early_start.pending(cfg) is None


def test_a_system_the_flow_never_got_is_stopped_without_waiting_out_its_start(tmp_path):
    cfg, system = config(tmp_path), RecordingSystem()  # its start waits until disposed
    early = early_start.begin(cfg, system)
    ender = threading.Thread(target=early_start.end, args=(early,))
    ender.start()
    ender.join(5)
    assert not ender.is_alive()
    # stopped while starting, and again once the start returned (what it made meanwhile)
    assert system.calls == ["start", "dispose", "dispose"]


def test_a_failed_start_is_the_flows_error_and_leaves_nothing_running(tmp_path):
    cfg, system = config(tmp_path), RecordingSystem(fail=RuntimeError("engine 0 exited"))
    system.release.set()
    early = early_start.begin(cfg, system)
    try:
        with pytest.raises(RuntimeError, match="engine 0 exited"), early_start.pending(cfg):
            pass
        assert system.calls == ["start", "dispose"]
    finally:
        early_start.end(early)


def test_a_failed_preflight_starts_nothing(tmp_path):
    system = RecordingSystem()
    missing = config(tmp_path, data={"train_path": str(tmp_path / "nope.jsonl")})
    assert early_start.begin(missing, system) is None
    assert early_start.pending(missing) is None
    assert system.calls == []
