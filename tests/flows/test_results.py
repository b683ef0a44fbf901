"""Task results go to the run's storage (flows/results.py): one write per task run, no lookup
before it (the key is the task run's own, so nothing can be there yet), nothing else sent to
the storage (on S3 every request is a round trip at the start or end of a task run), and
they read back through the same block."""

from __future__ import annotations

import pytest
import s3fs
from prefect import flow, task
from prefect.results import ResultStore

from flows.results import RunResultStorage, persisted
from infra.config import RunConfig
from infra.storage.fs import RunStore

pytestmark = pytest.mark.flow


@task(name="double")
def double(x: int) -> int:
    return 2 * x


def _run_three(cfg: RunConfig) -> list[str]:
    """Three task runs; the storage keys of their results."""
    (doubled,) = persisted(cfg, double)

    @flow
    def three() -> list[str]:
        futures = [doubled.submit(i) for i in range(3)]
        for future in futures:
            future.wait()
        return [f.state.data.metadata.storage_key for f in futures]

    return three()


def test_task_results_are_written_once_without_a_lookup(prefect_api, storage_uri: str, monkeypatch):
    reads: list[str] = []
    read_path = RunResultStorage.read_path

    def counted(self, path, *args, **kwargs):
        reads.append(path)
        return read_path(self, path, *args, **kwargs)

    monkeypatch.setattr(RunResultStorage, "read_path", counted)
    cfg = RunConfig(run_name="results", storage={"uri": storage_uri})
    keys = _run_three(cfg)
    assert reads == []  # no lookup before a write
    written = RunStore(cfg.storage, cfg.run_name).ls("prefect-results")
    assert len(written) == 3 and all(name.startswith("double-") for name in written)
    # what a client reads back later, through a block loaded from the API
    block = RunResultStorage.load("prl-results-results")
    assert sorted(ResultStore(result_storage=block).read(k).result for k in keys) == [0, 2, 4]


@pytest.mark.s3
def test_on_s3_a_task_result_is_one_put(prefect_api, s3_bucket: str, monkeypatch):
    calls: list[str] = []
    call_s3 = s3fs.S3FileSystem._call_s3

    async def counted(self, method, *args, **kwargs):
        calls.append(method)
        return await call_s3(self, method, *args, **kwargs)

    monkeypatch.setattr(s3fs.S3FileSystem, "_call_s3", counted)
    _run_three(RunConfig(run_name="results", storage={"uri": s3_bucket}))
    # Prefect's RemoteFileSystem looked the bucket up before every put (and would have made it)
    assert calls == ["put_object"] * 3
