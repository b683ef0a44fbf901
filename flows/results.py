"""Prefect result storage on the run's own storage (local folder or S3).

The block is created by the code, one per run name, so a deployment needs no block set
up by hand; task results (small dicts) then live beside the run's checkpoints, and a
flow run retried from the UI finds them (and resumes from the latest checkpoint).
"""

from __future__ import annotations

from prefect.filesystems import LocalFileSystem, RemoteFileSystem, WritableFileSystem
from prefect.tasks import Task

from infra.config import RunConfig
from infra.storage.fs import RunStore, is_local, storage_options


def result_storage(config: RunConfig) -> WritableFileSystem:
    uri = RunStore(config.storage, config.run_name).uri("prefect-results")
    if is_local(uri):
        block: WritableFileSystem = LocalFileSystem(basepath=uri)
    else:
        # endpoint and region only: credentials stay in the environment, never in a block
        block = RemoteFileSystem(basepath=uri, settings=storage_options(config.storage))
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
