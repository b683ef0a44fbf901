"""Paths and files of a run, on a local folder or S3, through one fsspec interface.

This module is the storage seam: every read and write of run data (checkpoint files,
rollouts, metrics, model directories) goes through `RunStore` or the directory helpers
below, so retries and error messages live here. Remote operations are retried with
backoff while the endpoint is down or erroring (`storage.retry_timeout_s`). Nothing here
creates a bucket: S3 has no folders, so no `mkdir`/`makedirs` is ever sent to it (s3fs
turns one on a missing bucket into CreateBucket).

Every worker (driver, Ray actors on other nodes) builds its own `RunStore` from the same
`StorageConfig`, so a store is cheap to create and carries no credentials.
"""

from __future__ import annotations

import os
import uuid

import fsspec
from fsspec.implementations.local import LocalFileSystem

from infra.config import StorageConfig
from infra.storage.retry import with_retries

DEFAULT_RETRY_S = StorageConfig.model_fields["retry_timeout_s"].default


def storage_options(cfg: StorageConfig) -> dict:
    """s3fs options from the config, falling back to the standard AWS environment variables.

    Credentials are deliberately NOT put here: these options travel in flow parameters, task
    arguments, logs and artifacts, where a secret must never appear. s3fs/botocore read
    AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY (or the profile) from each process's own
    environment instead.
    """
    options: dict = {}
    # The service-specific variable wins over the global one, as in botocore.
    endpoint = cfg.endpoint_url or os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
    if endpoint:
        options["endpoint_url"] = endpoint
    region = cfg.region or os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
    if region:
        options["client_kwargs"] = {"region_name": region}
    if cfg.profile:
        options["profile"] = cfg.profile
    return options


def is_local(uri: str) -> bool:
    return "://" not in uri or uri.startswith("file://")


def _local_abspath(uri: str) -> str:
    # Ray workers may run with another cwd: a relative path must mean the same folder everywhere.
    return os.path.abspath(os.path.expanduser(uri.removeprefix("file://")))


# Every call on a `filesystem` is retried by `with_retries`, within storage.retry_timeout_s.
# botocore's own retries of a dropped connection (4, with waits doubling to 8 s) under each
# of s3fs's tries stretched one attempt to 17-43 s, past that window (tests/unit/
# test_storage_outage.py). torch.distributed.checkpoint's writers open their own
# filesystems, which keep botocore's retries: nothing retries a checkpoint write around them.
_ONE_BOTOCORE_ATTEMPT = {"retries": {"total_max_attempts": 1}}


def filesystem(uri: str, options: dict) -> tuple[fsspec.AbstractFileSystem, str]:
    """The filesystem holding `uri` and the path inside it. `options` apply to S3 only, so
    one options dict (from `storage_options`) serves local and s3 paths alike."""
    if is_local(uri):
        return LocalFileSystem(), _local_abspath(uri)
    config = {**options.get("config_kwargs", {}), **_ONE_BOTOCORE_ATTEMPT}
    return fsspec.core.url_to_fs(uri, **{**options, "config_kwargs": config})


def upload_dir(local_dir: str, uri: str, options: dict, retry_s: float = DEFAULT_RETRY_S) -> None:
    """Copy the files of `local_dir` to `uri` (replacing what is there), `config.json` last:
    a reader that waits for config.json never sees a half-written model directory."""
    fs, path = filesystem(uri, options)
    names = sorted(os.listdir(local_dir), key=lambda n: n == "config.json")
    if isinstance(fs, LocalFileSystem):
        if fs.exists(path):
            fs.rm(path, recursive=True)
        os.makedirs(path, exist_ok=True)
    else:
        with_retries(lambda: fs.exists(path) and fs.rm(path, recursive=True), f"clear {uri}", retry_s)
    for name in names:
        src, dst = os.path.join(local_dir, name), f"{path}/{name}"
        with_retries(lambda s=src, d=dst: fs.put_file(s, d), f"upload {uri}/{name}", retry_s)


def download_dir(uri: str, local_dir: str, options: dict, retry_s: float = DEFAULT_RETRY_S) -> None:
    fs, path = filesystem(uri, options)
    with_retries(lambda: fs.get(f"{path}/", local_dir + "/", recursive=True), f"download {uri}", retry_s)


def uri_exists(uri: str, options: dict, retry_s: float = DEFAULT_RETRY_S) -> bool:
    fs, path = filesystem(uri, options)
    fs.invalidate_cache(path)
    return with_retries(lambda: fs.exists(path), f"look up {uri}", retry_s)


def read_uri(uri: str, options: dict, retry_s: float = DEFAULT_RETRY_S) -> bytes:
    fs, path = filesystem(uri, options)
    try:
        return with_retries(lambda: fs.cat_file(path), f"read {uri}", retry_s)
    except FileNotFoundError:
        raise FileNotFoundError(f"no such file: {uri}") from None


def join(uri: str, *parts: str) -> str:
    """`uri/part/...` with exactly one slash between pieces (empty parts are skipped)."""
    pieces = [uri.rstrip("/")] + [p.strip("/") for p in parts if p.strip("/")]
    return "/".join(pieces)


class RunStore:
    """The folder of one run: `<storage.uri>/<run_name>`; `rel` paths are relative to it."""

    def __init__(self, cfg: StorageConfig, run_name: str) -> None:
        base = _local_abspath(cfg.uri) if is_local(cfg.uri) else cfg.uri
        self.run_uri: str = join(base, run_name)
        self.options: dict = storage_options(cfg)
        self.fs, self._root = filesystem(self.run_uri, self.options)
        self.is_local: bool = isinstance(self.fs, LocalFileSystem)
        self.retry_s: float = cfg.retry_timeout_s

    def _io(self, op, what: str, rel: str):
        """Run a filesystem call; remote ones are retried through transient faults."""
        if self.is_local:
            return op()
        return with_retries(op, f"{what} {self.uri(rel)}", self.retry_s)

    def uri(self, *parts: str) -> str:
        """Full URI (local absolute path or s3://...) of a file of this run."""
        return join(self.run_uri, *parts)

    def path(self, rel: str = "") -> str:
        """Path of `rel` inside `self.fs` (no protocol)."""
        return join(self._root, rel)

    def exists(self, rel: str) -> bool:
        path = self.path(rel)
        # Another process may have written it since s3fs cached a listing here.
        self.fs.invalidate_cache(path)
        return self._io(lambda: self.fs.exists(path), "look up", rel)

    def write_bytes(self, rel: str, data: bytes) -> None:
        """Write a whole file. Readers never see a partial file: S3 puts are atomic, and
        locally the data goes to a temporary file first that is then renamed over the target."""
        path = self.path(rel)
        if not self.is_local:
            self._io(lambda: self.fs.pipe_file(path, data), "write", rel)
            return
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = f"{path}.tmp-{uuid.uuid4().hex}"
        try:
            with open(tmp, "wb") as f:
                f.write(data)
            os.replace(tmp, path)
        finally:
            if os.path.exists(tmp):
                os.remove(tmp)

    def write_text(self, rel: str, text: str) -> None:
        self.write_bytes(rel, text.encode("utf-8"))

    def read_bytes(self, rel: str) -> bytes:
        path = self.path(rel)
        try:
            return self._io(lambda: self.fs.cat_file(path), "read", rel)
        except FileNotFoundError:
            raise FileNotFoundError(f"no such file: {self.uri(rel)}") from None

    def read_text(self, rel: str) -> str:
        return self.read_bytes(rel).decode("utf-8")

    def delete(self, rel: str, recursive: bool = False) -> None:
        """Remove a file (or a folder with `recursive`); a missing one is not an error, so
        retried clean-ups are harmless."""
        if self.exists(rel):
            self._io(lambda: self.fs.rm(self.path(rel), recursive=recursive), "delete", rel)

    def ls(self, rel: str = "") -> list[str]:
        """Sorted names (not paths) directly under `rel`; [] when it does not exist (S3 has no
        empty folders, so a missing folder and an empty one must read the same)."""
        path = self.path(rel)
        self.fs.invalidate_cache(path)
        try:
            entries = self._io(lambda: self.fs.ls(path, detail=False), "list", rel)
        except FileNotFoundError:
            return []
        return sorted(e.rstrip("/").rsplit("/", 1)[-1] for e in entries)

    def __repr__(self) -> str:
        return f"RunStore({self.run_uri!r})"
