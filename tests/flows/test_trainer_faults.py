"""A trainer rank SIGKILLed mid-run: the flow fails soon with an error naming the rank,
leaves no process behind, and a re-run with `checkpoint.resume=auto` continues from the
last committed checkpoint."""

from __future__ import annotations

import ast
import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from flows.train import train
from infra.config_files import load_config
from infra.storage.fs import RunStore
from infra.storage.metrics import read_metrics
from tests.flows.test_resume import write_prompts

pytestmark = pytest.mark.flow
REPO = Path(__file__).resolve().parents[2]
DETECT_LIMIT_S = 10  # from the kill to the flow process's exit, disposal included


def alive(procs: list[psutil.Process]) -> list[psutil.Process]:
    out = []
    for p in procs:
        with contextlib.suppress(psutil.NoSuchProcess):
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
    return out


def test_killed_trainer_rank_fails_fast_naming_it_and_resume_continues(prefect_api, tmp_path):
    data = write_prompts(tmp_path / "prompts.jsonl", 24)
    args = [
        "run_name=rankkill",
        "mode=async",
        "num_rollout=4",
        f"storage.uri={tmp_path / 'runs'}",
        f"data.train_path={data}",
        f"data.eval_path={data}",
        "data.prompt_key=q",
        "data.label_key=a",
        "rollout.prompts_per_rollout=8",
        "rollout.n_samples_per_prompt=4",
        "rollout.sampling.max_new_tokens=2",
        "checkpoint.save_interval=1",
        "eval.interval=null",
        "cluster.collective_timeout_s=30",
    ]
    store = RunStore(load_config(None, args).storage, "rankkill")
    log = tmp_path / "killed.log"
    env = {**os.environ, "PREFECT_API_URL": prefect_api}
    with log.open("w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "flows.train", *args],
            cwd=REPO,
            env=env,
            start_new_session=True,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + 300
        while not store.exists("checkpoints/iter_0000001/COMMITTED"):
            assert proc.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, "no checkpoint within 300 s"
            time.sleep(0.1)
        pids = ast.literal_eval(re.search(r"process ids: (\{.*\})", log.read_text()).group(1))
        tree = psutil.Process(proc.pid).children(recursive=True)  # Ray, actors, engine servers
        rank1 = psutil.Process(pids["trainer_ranks"][1])
        assert rank1 in tree
        rank1.send_signal(signal.SIGKILL)
        t_kill = time.monotonic()
        rc = proc.wait(timeout=DETECT_LIMIT_S + 60)
        took = time.monotonic() - t_kill
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    text = log.read_text()
    print(f"rank 1 killed: flow exited with {rc} after {took:.1f}s")
    assert rc != 0
    assert "trainer rank 1 died" in text, text[-4000:]
    assert took < DETECT_LIMIT_S, text[-3000:]
    # no process of the run outlives it (Ray's, the actors', the engine servers)
    deadline = time.monotonic() + 20
    while alive(tree) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert alive(tree) == [], [(p.pid, p.cmdline()) for p in alive(tree)]

    before = read_metrics(store)
    committed = [k for k in range(4) if store.exists(f"checkpoints/iter_{k:07d}/COMMITTED")]
    last = max(committed)
    state = train(load_config(None, [*args, "checkpoint.resume=auto"]), return_state=True)
    assert state.is_completed(), state.message
    rows = read_metrics(store)
    assert [r["rollout_id"] for r in rows] == [0, 1, 2, 3]  # no duplicated or missing row
    # the iterations up to the checkpoint were kept, not redone
    assert rows[: last + 1] == before[: last + 1]
