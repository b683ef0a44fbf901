"""torch.distributed.checkpoint readers and writers for a local folder or any fsspec URL.

The fsspec writer of torch calls `makedirs` on the checkpoint folder; on S3, s3fs turns
that into CreateBucket when the bucket does not answer as existing (deleted, or the
endpoint down), and a training run must never create a bucket. S3 has no folders, so
here `mkdir` does nothing on object stores. Retrying a DCP save is the save task's job:
the save is collective over the ranks and is redone whole (see infra/handles.py).

DCP reports a failed write as `CheckpointException`, a BaseException that Ray and
Prefect would treat as a crash; `save_state`/`load_state` raise the first rank's error
as an ordinary exception instead, so a save task retries transient storage faults and
fails at once on deterministic ones (a missing bucket).

`BackgroundSave` is the asynchronous form: the call returns once the state is copied
(staged) to fresh CPU tensors, so training may change the weights while a thread writes
the copy; its collectives run on a process group of their own, never on the one training
uses at the same time. Nobody may treat the folder as a checkpoint before `wait()`
returned: the caller writes the commit marker only then.
"""

from __future__ import annotations

import os
from concurrent.futures import Future

import torch.distributed as dist
import torch.distributed.checkpoint as dcp

# torch keeps its fsspec storage in a private module; it is the documented way to write
# DCP checkpoints to object stores.
from torch.distributed.checkpoint._fsspec_filesystem import FileSystem, FsspecReader, FsspecWriter
from torch.distributed.checkpoint.api import CheckpointException

from infra.storage.retry import StorageUnavailable, is_transient


class _NoBucketFileSystem(FileSystem):
    def mkdir(self, path: str | os.PathLike) -> None:
        from fsspec.implementations.local import LocalFileSystem

        if isinstance(self.fs, LocalFileSystem):
            super().mkdir(path)


def _no_bucket_creation(storage: FsspecWriter | FsspecReader) -> FsspecWriter | FsspecReader:
    fs = _NoBucketFileSystem()
    fs.fs = storage.fs.fs
    storage.fs = fs
    return storage


def checkpoint_writer(path: str, storage_options: dict):
    if "://" in path:  # s3:// or any fsspec URL; options (endpoint_url, region) go to fsspec
        return _no_bucket_creation(FsspecWriter(path, **storage_options))
    return dcp.FileSystemWriter(path)


def checkpoint_reader(path: str, storage_options: dict):
    if "://" in path:
        return _no_bucket_creation(FsspecReader(path, **storage_options))
    return dcp.FileSystemReader(path)


def _plain_error(exc: CheckpointException, what: str) -> Exception:
    failures = list(exc.failures.values())
    first = failures[0][0] if failures and isinstance(failures[0], tuple) else None
    if not isinstance(first, Exception):
        return RuntimeError(f"{what}: {exc}")
    message = f"{what}: {type(first).__name__}: {first}"
    if is_transient(first):
        return StorageUnavailable(message)
    for kind in (FileNotFoundError, PermissionError, ValueError, OSError):
        if isinstance(first, kind):
            return kind(message)  # the same kind, so retry rules (infra/errors.py) still apply
    return RuntimeError(message)


def save_state(state: dict, path: str, storage_options: dict) -> None:
    try:
        dcp.save(state, storage_writer=checkpoint_writer(path, storage_options))
    except CheckpointException as exc:
        raise _plain_error(exc, f"checkpoint write to {path}") from None


def load_state(state: dict, path: str, storage_options: dict) -> None:
    try:
        dcp.load(state, storage_reader=checkpoint_reader(path, storage_options))
    except CheckpointException as exc:
        raise _plain_error(exc, f"checkpoint read from {path}") from None


class BackgroundSave:
    """One DCP save written by a background thread; `wait()` returns its path once durable."""

    def __init__(
        self, state: dict, path: str, storage_options: dict, group: dist.ProcessGroup | None
    ) -> None:
        self.path = path
        # the writer stages (copies) the state before async_save returns
        self._future: Future = dcp.async_save(
            state, storage_writer=checkpoint_writer(path, storage_options), process_group=group
        )

    def wait(self) -> str:
        try:
            self._future.result()
        except CheckpointException as exc:
            raise _plain_error(exc, f"checkpoint write to {self.path}") from None
        return self.path
