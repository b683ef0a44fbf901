"""Prefect result storage on the run's own storage (local folder or S3).

The block is created by the code, one per run name, so a deployment needs no block set
up by hand; task results (small dicts) then live beside the run's checkpoints, and a
flow run retried from the UI finds them (and resumes from the latest checkpoint).
"""

from __future__ import annotations

import asyncio
import json
from functools import lru_cache

from prefect.filesystems import WritableFileSystem
from prefect.tasks import Task

from infra.config import RunConfig, StorageConfig
from infra.storage.fs import RunStore

RESULTS_FOLDER = "prefect-results"


class RunResultStorage(WritableFileSystem):
    """Prefect results in `<run folder>/prefect-results/`, read and written through the
    project's storage seam (infra/storage/fs.py): one put per result, retried through
    storage outages like every other write of the run, and never a `makedirs`. Prefect's
    own RemoteFileSystem sends one before every write, which on S3 is a bucket lookup (a
    round trip at the end of every task run) and a CreateBucket where the bucket is missing.
    Holds the run's storage section, which carries no credentials."""

    _block_type_name = "RL Run Result Storage"
    _description = "Task results in the run folder of a prefect-rl run, on its local or S3 storage."

    storage: dict
    run_name: str

    def _store(self) -> RunStore:
        return _run_store(json.dumps(self.storage, sort_keys=True), self.run_name)

    def read_path(self, path: str, _sync: bool | None = None) -> bytes:
        return self._store().read_bytes(f"{RESULTS_FOLDER}/{path}")

    def write_path(self, path: str, content: bytes, _sync: bool | None = None) -> str:
        store = self._store()
        store.write_bytes(f"{RESULTS_FOLDER}/{path}", content)
        return store.uri(RESULTS_FOLDER, path)

    async def aread_path(self, path: str) -> bytes:
        return await asyncio.to_thread(self.read_path, path)

    async def awrite_path(self, path: str, content: bytes) -> str:
        return await asyncio.to_thread(self.write_path, path, content)


@lru_cache(maxsize=8)
def _run_store(storage: str, run_name: str) -> RunStore:
    """One store per run and process: Prefect calls the block for every result."""
    return RunStore(StorageConfig.model_validate_json(storage), run_name)


def result_storage(config: RunConfig) -> RunResultStorage:
    block = RunResultStorage(storage=config.storage.model_dump(mode="json"), run_name=config.run_name)
    block.save(f"prl-results-{config.run_name.lower().replace('.', '-').replace('_', '-')}", overwrite=True)
    return block


def persisted(config: RunConfig, *tasks: Task) -> tuple[Task, ...]:
    """The tasks with their results persisted to the run's storage."""
    storage = result_storage(config)
    # Prefect writes a result only under a key; caching stays off (a retried task must
    # really run again), so the key comes from the task run's own name and id. With a key,
    # Prefect first looks the result up (a storage round trip, an S3 HEAD, at the start of
    # every task run); a key of the run's own can hold nothing yet, so the write overwrites.
    options = {
        "result_storage_key": "{task_run.name}-{task_run.id}",
        "cache_policy": None,
        "refresh_cache": True,
    }
    return tuple(t.with_options(result_storage=storage, persist_result=True, **options) for t in tasks)
