"""Plug-in rewards in worker processes (`data.reward_isolation=process`, the default): a call
past its time limit is stopped, with its process, instead of running on in a thread; a
crash fails only its samples; nothing outlives the pool or its parent."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

from infra.config import DataConfig
from infra.data.reward_process import ProcessReward, stop_workers
from infra.data.rewards import resolve_reward, score

REPO = Path(__file__).resolve().parents[2]

PLUGIN = """
import os, time
from infra.data.group_rewards import group_reward

def reward(prompt, response, label, **kw):
    if response == "hang":
        with open(label, "w") as f:
            f.write(str(os.getpid()))
        time.sleep(600)
    if response == "crash":
        os._exit(3)
    if response.startswith("sleep"):
        time.sleep(float(response.split()[1]))
    return float(len(response)) * kw.get("scale", 1.0)

@group_reward
def ranked(prompts, responses, labels, **kw):
    time.sleep(0.3)
    order = sorted(responses, key=len)
    return [order.index(r) / max(1, len(order) - 1) for r in responses]
"""


@pytest.fixture
def plugin(tmp_path):
    path = tmp_path / "grader.py"
    path.write_text(PLUGIN)
    yield path
    stop_workers()


def isolated(spec: str, timeout_s: float = 5, workers: int = 2):
    return resolve_reward(spec, DataConfig(reward=spec, reward_timeout_s=timeout_s, reward_workers=workers))


def spawned_workers() -> set[int]:
    """This process's multiprocessing children (the suite's other fixtures have children too)."""
    found = set()
    for p in psutil.Process().children(recursive=True):
        try:
            if p.status() != psutil.STATUS_ZOMBIE and "spawn_main" in " ".join(p.cmdline()):
                found.add(p.pid)
        except psutil.NoSuchProcess:
            continue
    return found


def test_plug_in_rewards_run_in_processes_unless_told_threads(plugin) -> None:
    spec = f"{plugin}:reward"
    fn = isolated(spec)
    assert isinstance(fn, ProcessReward)
    results = score(fn, [("p", "abc", "l"), ("p", "de", "l")], timeout_s=5, scale=2.0)
    assert [r.reward for r in results] == [6.0, 4.0]
    assert "grader" in fn.__module__ and fn.__qualname__ == "reward"  # errors name the plug-in
    plain = resolve_reward(spec, DataConfig(reward=spec, reward_isolation="thread"))
    assert not isinstance(plain, ProcessReward) and plain("p", "abc", "l") == 3.0
    assert resolve_reward("exact_match", DataConfig()).__name__ == "exact_match"  # built-ins in threads


def test_a_timed_out_reward_is_stopped_with_its_process(plugin, tmp_path) -> None:
    fn = isolated(f"{plugin}:reward", timeout_s=1.0)
    fn.call_many([("p", "warm", "l")], {})  # workers up: the pool's start is not the test
    assert 1 <= len(spawned_workers()) <= 2
    threads_before = threading.active_count()
    for round_ in range(3):
        pid_file = tmp_path / f"hang{round_}"
        t0 = time.monotonic()
        results = score(
            fn, [("p", "ok", "l"), ("p", "hang", str(pid_file)), ("p", "fine", "l")], timeout_s=1.0
        )
        took = time.monotonic() - t0
        assert [r.status for r in results] == ["completed", "failed", "completed"]
        assert "reward_timeout_s=1" in results[1].error and "worker process was stopped" in results[1].error
        assert took < 5, took
        hung = int(pid_file.read_text())
        assert not psutil.pid_exists(hung) or psutil.Process(hung).status() == psutil.STATUS_ZOMBIE
    # no thread left behind per timed-out call (a thread-run reward leaves one each time)
    assert threading.active_count() <= threads_before + 1
    assert len(spawned_workers()) <= 2  # each stopped worker was replaced, none added


def test_a_reward_that_ends_its_process_fails_only_its_sample(plugin) -> None:
    fn = isolated(f"{plugin}:reward")
    results = score(fn, [("p", "ok", "l"), ("p", "crash", "l"), ("p", "fine", "l")], timeout_s=5)
    assert [r.status for r in results] == ["completed", "failed", "completed"]
    assert "exit code 3" in results[1].error and str(plugin) in results[1].error
    assert score(fn, [("p", "again", "l")], timeout_s=5)[0].reward == 5.0  # a fresh worker took over


def test_calls_queued_behind_busy_workers_are_not_timed_out(plugin) -> None:
    # one worker, six calls of 0.3 s each under a 1 s limit: 1.8 s in all, every call in time
    fn = isolated(f"{plugin}:reward", timeout_s=1.0, workers=1)
    items = [("p", "sleep 0.3", "l")] * 6
    results = score(fn, items, timeout_s=1.0)
    assert [r.status for r in results] == ["completed"] * 6, [r.error for r in results]


def test_a_group_reward_keeps_its_scope_in_a_process(plugin) -> None:
    fn = isolated(f"{plugin}:ranked", timeout_s=1.0, workers=1)
    assert fn.reward_scope == "group"
    items = [("p", r, "l") for r in ("aaa", "a", "aa", "bb", "b", "bbbb")]
    # two groups of 0.3 s each on one worker: the second waits for the first, still in time
    results = score(fn, items, timeout_s=1.0, groups=[0, 0, 0, 1, 1, 1])
    assert [r.reward for r in results] == [1.0, 0.0, 0.5, 0.5, 0.0, 1.0]


def test_workers_exit_with_their_parent(plugin) -> None:
    code = (
        "import sys\n"
        "from infra.config import DataConfig\n"
        "from infra.data.rewards import resolve_reward, score\n"
        f"spec = {str(plugin) + ':reward'!r}\n"
        "fn = resolve_reward(spec, DataConfig(reward=spec, reward_workers=2))\n"
        "print(score(fn, [('p', 'ok', 'l')], timeout_s=5)[0].reward, flush=True)\n"
        "import time; time.sleep(600)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=REPO, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "2.0"
        workers = psutil.Process(proc.pid).children(recursive=True)
        assert workers
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        gone, alive = psutil.wait_procs(workers, timeout=15)
        assert alive == [], [(p.pid, p.cmdline()) for p in alive]
    finally:
        if proc.poll() is None:
            proc.kill()
