"""PRL_TASK_RUNNER picks the flow's task runner: the fast one by default, prefect-ray's own
as it is with `stock` (flows/prefect_on_ray/switch.py)."""

from __future__ import annotations

import pytest
from prefect_ray import RayTaskRunner

from flows.prefect_on_ray import TASK_RUNNER_ENV, FastRayTaskRunner, task_runner


def test_the_environment_picks_the_task_runner(monkeypatch):
    monkeypatch.delenv(TASK_RUNNER_ENV, raising=False)
    assert type(task_runner()) is FastRayTaskRunner
    for value, kind in (("", FastRayTaskRunner), ("fast", FastRayTaskRunner), ("stock", RayTaskRunner)):
        monkeypatch.setenv(TASK_RUNNER_ENV, value)
        assert type(task_runner()) is kind, value
    assert type(task_runner("fast")) is FastRayTaskRunner  # an explicit kind wins
    monkeypatch.setenv(TASK_RUNNER_ENV, "slow")
    with pytest.raises(ValueError, match="PRL_TASK_RUNNER='slow'.*fast, stock"):
        task_runner()
