"""Storage through an S3 outage: a loopback proxy in front of the moto server drops every
connection while "down" (moto keeps its data, unlike a restarted in-memory server).
Writes are retried until it is back; when the retries are spent the error names the
operation and URI, and the previous checkpoint stays `latest`. No bucket is ever created."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
import uuid
from urllib.parse import urlparse

import pytest
import s3fs

from infra.config import RunConfig, StorageConfig
from infra.preflight import PreflightError, preflight
from infra.storage.checkpoints import CheckpointStore
from infra.storage.fs import RunStore, upload_dir
from infra.storage.retry import StorageUnavailable, is_transient, with_retries

pytestmark = pytest.mark.s3


class DroppingProxy:
    """TCP proxy on 127.0.0.1; while `down`, accepted connections are closed at once."""

    def __init__(self, target: str) -> None:
        url = urlparse(target)
        self.target = (url.hostname, url.port)
        self.server = socket.create_server(("127.0.0.1", 0))
        self.endpoint = f"http://127.0.0.1:{self.server.getsockname()[1]}"
        self.down = False
        self.dropped = 0
        self._stop = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self._stop:
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            if self.down:
                self.dropped += 1
                client.close()
                continue
            upstream = socket.create_connection(self.target)
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while True:
                data = src.recv(65536)
                if not data or self.down:
                    break
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.close()

    def close(self) -> None:
        self._stop = True
        self.server.close()


@pytest.fixture
def proxy(moto_s3):
    p = DroppingProxy(moto_s3)
    yield p
    p.close()


# One attempt on a dropped connection: s3fs's own tries and their sleeps, with room for a
# loaded machine.
ONE_ATTEMPT_S = 6.0


def test_zero_retry_time_is_one_attempt(proxy, s3_bucket):
    store = store_via(proxy, s3_bucket, retry_s=0)
    proxy.down = True
    t0 = time.monotonic()
    with pytest.raises(StorageUnavailable, match=r"for 0 s \(1 attempts\)"):
        store.write_text("c.txt", "never")
    # s3fs's 5 tries at most, each sent on a second connection when aiohttp sees the first
    # one reset (it resends an idempotent request once); which error the drop gives, and so
    # whether it is resent, depends on timing
    assert time.monotonic() - t0 < ONE_ATTEMPT_S and proxy.dropped <= 2 * 5


def store_via(proxy: DroppingProxy, bucket: str, retry_s: float) -> RunStore:
    s3fs.S3FileSystem.clear_instance_cache()
    cfg = StorageConfig(uri=f"{bucket}/runs", endpoint_url=proxy.endpoint, retry_timeout_s=retry_s)
    return RunStore(cfg, "outage")


def bring_up_after(proxy: DroppingProxy, seconds: float) -> threading.Thread:
    def up() -> None:
        time.sleep(seconds)
        proxy.down = False

    t = threading.Thread(target=up)
    t.start()
    return t


def test_writes_are_retried_through_an_outage(proxy, s3_bucket):
    store = store_via(proxy, s3_bucket, retry_s=60)
    store.write_text("a.txt", "before")
    proxy.down = True
    t0 = time.monotonic()
    upper = bring_up_after(proxy, 3)
    store.write_text("b.txt", "during")  # blocks through the outage, then succeeds
    upper.join()
    assert time.monotonic() - t0 >= 2.5 and proxy.dropped > 0
    assert store.read_text("b.txt") == "during" and store.read_text("a.txt") == "before"


def test_spent_retries_fail_clearly_and_keep_the_previous_checkpoint(proxy, s3_bucket):
    store = store_via(proxy, s3_bucket, retry_s=2)
    ckpts = CheckpointStore(store, keep_last=2)
    ckpts.begin(1)
    ckpts.commit(1, {"next_rollout_id": 2})
    proxy.down = True
    t0 = time.monotonic()
    with pytest.raises(StorageUnavailable, match=r"write s3://.*/outage/checkpoints/iter_0000002/meta.json"):
        ckpts.commit(2, {"next_rollout_id": 3})
    assert time.monotonic() - t0 < 2 + ONE_ATTEMPT_S  # storage.retry_timeout_s holds
    proxy.down = False
    assert ckpts.latest() == 1 and not ckpts.is_committed(2)
    assert store.read_text("checkpoints/latest") == "iter_0000001"


def test_no_bucket_is_ever_created(moto_s3, tmp_path):
    s3fs.S3FileSystem.clear_instance_cache()
    missing = f"s3://gone-{uuid.uuid4().hex[:12]}"
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(FileNotFoundError):
        upload_dir(str(tmp_path), f"{missing}/run/base_model", {"endpoint_url": moto_s3}, retry_s=1)
    cfg = RunConfig.model_validate({"storage": {"uri": f"{missing}/runs", "retry_timeout_s": 1}})
    with pytest.raises(PreflightError, match=r"storage.uri: cannot write to s3://gone-"):
        preflight(cfg)
    fs = s3fs.S3FileSystem(endpoint_url=moto_s3)
    assert missing.removeprefix("s3://") not in [b.rstrip("/") for b in fs.ls("")]


def test_preflight_fails_fast_when_the_endpoint_is_down(proxy, s3_bucket):
    proxy.down = True
    cfg = RunConfig.model_validate(
        {"storage": {"uri": f"{s3_bucket}/runs", "endpoint_url": proxy.endpoint, "retry_timeout_s": 2}}
    )
    s3fs.S3FileSystem.clear_instance_cache()
    t0 = time.monotonic()
    with pytest.raises(PreflightError, match=r"storage.uri: cannot write to .*StorageUnavailable"):
        preflight(cfg)
    # the 2 s window and one last attempt (s3fs's own 5 tries sleep 1.9 s in all); botocore's
    # retries under each of those would add up to 15 s per try
    assert time.monotonic() - t0 < 2 + ONE_ATTEMPT_S


def test_transient_or_not():
    assert is_transient(ConnectionRefusedError())
    assert is_transient(TimeoutError())
    assert not is_transient(FileNotFoundError("x"))
    assert not is_transient(PermissionError("x"))
    assert not is_transient(ValueError("x"))
    calls = []

    def flaky():
        calls.append(1)
        if len(calls) < 3:
            raise ConnectionResetError("dropped")
        return "ok"

    assert with_retries(flaky, "op", timeout_s=10, first_delay_s=0.01) == "ok" and len(calls) == 3

    def missing():
        calls.append(1)
        raise FileNotFoundError("/nonexistent/x")

    with pytest.raises(FileNotFoundError):  # not retried
        with_retries(missing, "op", timeout_s=10)
    assert len(calls) == 4
