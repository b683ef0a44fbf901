"""What the Prefect UI shows of a run, read back through the Prefect client: artifacts,
task-run logs written on Ray workers, retries as task-run states, and parameter errors."""

import asyncio
import re
import time
from pathlib import Path
from urllib.parse import urlparse

import pytest
import ray
from prefect import flow
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import (
    ArtifactFilter,
    ArtifactFilterKey,
    FlowRunFilter,
    FlowRunFilterId,
    LogFilter,
    LogFilterFlowRunId,
    LogFilterTaskRunId,
)
from prefect.client.schemas.sorting import ArtifactSort

import infra.system
from flows.artifacts import artifact_key
from flows.train import train
from infra.config import RunConfig
from tasks.generate import generate

pytestmark = pytest.mark.flow


def tiny_config(tmp_path, num_rollout: int, **over) -> RunConfig:
    tree = {
        "run_name": "Art_1",  # upper case and '_': artifact keys must still be valid
        "num_rollout": num_rollout,
        "rollout": {"prompts_per_rollout": 8, "n_samples_per_prompt": 4},
        "storage": {"uri": str(tmp_path / "runs")},
        "checkpoint": {"resume": "auto"},
        "eval": {"interval": 2, "num_prompts": 4, "n_samples": 2, "pass_k": [1, 2]},
    }
    tree.update(over)
    return RunConfig.model_validate(tree)


async def _versions(key: str) -> list:
    """Every version of a keyed artifact, newest first."""
    async with get_client() as client:
        return await client.read_artifacts(
            artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=[key])), sort=ArtifactSort.CREATED_DESC
        )


async def _task_run_logs(flow_run_id, names: list[str], timeout_s: float = 30) -> dict[str, list[str]]:
    """Messages of the named task runs; logs reach the API in batches, so poll a little."""
    async with get_client() as client:
        runs = await client.read_task_runs(
            flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id]))
        )
        by_name = {r.name: r for r in runs}
        deadline = time.monotonic() + timeout_s
        while True:
            logs = {}
            for name in names:
                found = await client.read_logs(
                    log_filter=LogFilter(task_run_id=LogFilterTaskRunId(any_=[by_name[name].id]))
                )
                logs[name] = [log.message for log in found]
            if all(logs.values()) or time.monotonic() > deadline:
                return logs
            await asyncio.sleep(1)


def test_artifacts_and_worker_logs_across_two_runs(prefect_api, tmp_path):
    first = train(tiny_config(tmp_path, 2), return_state=True)
    assert first.is_completed(), first.message
    # the nightly pattern: the same run name, resume=auto, more iterations
    second = train(tiny_config(tmp_path, 3), return_state=True)
    assert second.is_completed(), second.message
    run1, run2 = first.state_details.flow_run_id, second.state_details.flow_run_id

    # keyed metrics table: one version per run, the newest covering all iterations so far
    tables = asyncio.run(_versions(artifact_key("Art_1", "metrics")))
    assert [t.flow_run_id for t in tables] == [run2, run1]
    assert tables[0].type == "table"
    assert [row["rollout_id"] for row in _table(tables[0].data)] == [0, 1, 2]
    assert [row["rollout_id"] for row in _table(tables[1].data)] == [0, 1]

    latest = {a.key: a for a in reversed(asyncio.run(_run_artifacts(run1)))}
    progress = latest[artifact_key("Art_1", "progress")]
    assert progress.type == "progress" and float(progress.data) == 100.0

    assert (
        _linked_path(latest[artifact_key("Art_1", "reward-curve")]).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    )
    for what in ("checkpoint", "hf-export", "rollouts"):
        assert _linked_path(latest[artifact_key("Art_1", what)]).exists(), what

    summary = latest[artifact_key("Art_1", "eval")]
    assert summary.type == "markdown"
    assert "eval_reward_mean" in summary.data and "Sample completions" in summary.data
    # a sample completion: | `prompt` | `response` | `label` | reward |
    assert re.search(r"^\| `[^`]+` \| (`[^`]*`|\(empty\)) \| `[^`]+` \| \d\.\d\d \|$", summary.data, re.M), (
        summary.data
    )

    # task runs on Ray workers log to the API: one generate and one train task run
    logs = asyncio.run(_task_run_logs(run1, ["generate-0000", "train-0000"]))
    assert any("rollout 0:" in m for m in logs["generate-0000"]), logs
    assert any("train 0:" in m for m in logs["train-0000"]), logs


async def _run_artifacts(flow_run_id) -> list:
    async with get_client() as client:
        return await client.read_artifacts(
            flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id])),
            sort=ArtifactSort.CREATED_DESC,
        )


def _linked_path(artifact) -> Path:
    """The local file a link artifact (`[text](file://...)`) points to."""
    return Path(urlparse(re.search(r"\((file://[^)]+)\)", artifact.data).group(1)).path)


def _table(data) -> list[dict]:
    import json

    return json.loads(data) if isinstance(data, str) else data


class FlakyRun:
    """Stands in for RunHandles: the engines fail the first rollout request."""

    def __init__(self):
        self.calls = 0

    def generate(self, rollout_id: int) -> dict:
        self.calls += 1
        if self.calls == 1:
            raise ConnectionError("engine not reachable (simulated)")
        return {"num_samples": 4, "reward_mean": 0.5, "weight_version": 0, "time_generate_s": 0.01}


def test_generate_retry_is_visible_as_task_run_states(prefect_api):
    @flow
    def one_generate(run):
        return generate.submit(run, 7).result()

    state = one_generate(FlakyRun(), return_state=True)
    assert state.is_completed(), state.message

    async def states():
        async with get_client() as client:
            (tr,) = await client.read_task_runs(
                flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[state.state_details.flow_run_id]))
            )
            return tr.name, [s.name for s in await client.read_task_run_states(tr.id)]

    name, history = asyncio.run(states())
    assert name == "generate-0007"
    assert "AwaitingRetry" in history and "Retrying" in history and history[-1] == "Completed", history


def test_invalid_parameter_fails_fast_naming_the_field(prefect_api, monkeypatch):
    def no_start(self):
        raise AssertionError("the run must fail before anything starts")

    monkeypatch.setattr(infra.system.RLSystem, "start", no_start)
    t0 = time.monotonic()
    state = train(config={"algorithm": {"lr": -1}}, return_state=True)
    assert state.is_failed()
    assert "config.algorithm.lr: Input should be greater than 0" in state.message, state.message
    assert time.monotonic() - t0 < 30
    assert not ray.is_initialized()


def test_progress_moves_at_most_once_a_second_and_always_reaches_the_end(monkeypatch):
    import flows.artifacts as artifacts

    updates: list[float] = []
    clock = [100.0]
    monkeypatch.setattr(artifacts, "create_progress_artifact", lambda **kw: "progress-id")
    monkeypatch.setattr(artifacts, "update_progress_artifact", lambda _id, pct: updates.append(pct))
    monkeypatch.setattr(artifacts.time, "monotonic", lambda: clock[0])
    report = artifacts.RunArtifacts(RunConfig(num_rollout=40), start=0)
    for k in range(40):
        clock[0] += 0.3  # iterations of 0.3 s
        report.iteration_done(k, {})
    # one update per ~1 s of iterations (every 4th at 0.3 s), and the last iteration's
    assert updates == [10.0, 20.0, 30.0, 40.0, 50.0, 60.0, 70.0, 80.0, 90.0, 100.0]


def test_learning_warnings_are_warning_lines_and_an_artifact_of_the_flow_run(prefect_api, tmp_path):
    import logging

    from flows.artifacts import RunArtifacts

    cfg = tiny_config(tmp_path, 6)
    # the pick-digit collapse: the entropy falls to 0.05 while 40% of the prompts stay wrong
    rows = [{"stuck_group_frac": 0.4, "entropy": e} for e in (3.0, 1.0, 0.05, 0.04, 0.05, 0.03)]

    @flow
    def iterations() -> None:
        report = RunArtifacts(cfg, start=0)
        for k, row in enumerate(rows):
            report.iteration_done(k, row)

    state = iterations(return_state=True)
    assert state.is_completed(), state.message
    run_id = state.state_details.flow_run_id

    async def warnings() -> list[str]:
        async with get_client() as client:
            deadline = time.monotonic() + 30
            while True:
                found = await client.read_logs(
                    log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=[run_id]))
                )
                lines = [log.message for log in found if log.level == logging.WARNING]
                if lines or time.monotonic() > deadline:
                    return lines
                await asyncio.sleep(1)

    # one warning, at the iteration the collapse started, not at every iteration it lasts
    lines = asyncio.run(warnings())
    assert len(lines) == 1 and lines[0].startswith(
        "iter 0002 | entropy collapse: mean token entropy 0.050"
    ), lines
    latest = {a.key: a for a in reversed(asyncio.run(_run_artifacts(run_id)))}
    note = latest[artifact_key("Art_1", "learning-warnings")]
    assert note.type == "markdown" and "- iteration 2: entropy collapse" in note.data
