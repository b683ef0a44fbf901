"""Task results go to the run's storage (flows/results.py) with one write per task run and
no lookup before it: the key is the task run's own, so nothing can be there yet, and a
lookup is a storage round trip (an S3 HEAD) at the start of every task run of the loop."""

from __future__ import annotations

from pathlib import Path

from prefect import flow, task
from prefect.filesystems import LocalFileSystem

from flows.results import persisted
from infra.config import RunConfig


@task(name="double")
def double(x: int) -> int:
    return 2 * x


def test_task_results_are_written_once_without_a_lookup(prefect_api, tmp_path: Path, monkeypatch):
    reads: list[str] = []
    read_path = LocalFileSystem.read_path

    def counted(self, path, *args, **kwargs):
        reads.append(path)
        return read_path(self, path, *args, **kwargs)

    monkeypatch.setattr(LocalFileSystem, "read_path", counted)
    cfg = RunConfig(run_name="results", storage={"uri": str(tmp_path)})
    (doubled,) = persisted(cfg, double)

    @flow
    def three() -> list[int]:
        return [doubled(i) for i in range(3)]

    assert three() == [0, 2, 4]
    assert reads == []  # no lookup before a write
    written = sorted(p.name for p in (tmp_path / "results" / "prefect-results").iterdir())
    assert len(written) == 3 and all(name.startswith("double-") for name in written)
