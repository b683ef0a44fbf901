"""Shared fixtures: a moto S3 server on loopback (a real S3 HTTP API, no network), a fresh
bucket per test, and `storage_uri` that runs a storage test on a local folder and on S3."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from infra.cluster.network import free_port


def _moto_server_executable() -> str:
    beside_python = Path(sys.executable).parent / "moto_server"
    found = str(beside_python) if beside_python.exists() else shutil.which("moto_server")
    if not found:
        pytest.skip("moto_server not installed (pip install 'moto[server]')")
    return found


def _wait_until_up(endpoint: str, proc: subprocess.Popen, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"moto_server exited with code {proc.returncode}")
        try:
            urllib.request.urlopen(endpoint, timeout=1).close()
            return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"moto_server did not answer at {endpoint} within {timeout_s} s")


@pytest.fixture(scope="session")
def moto_s3() -> Iterator[str]:
    """Endpoint of a moto S3 server for the session, with the AWS_* env pointing at it."""
    port = free_port()
    endpoint = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen(
        [_moto_server_executable(), "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        _wait_until_up(endpoint, proc)
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv("AWS_ACCESS_KEY_ID", "testing")
            mp.setenv("AWS_SECRET_ACCESS_KEY", "testing")
            mp.setenv("AWS_DEFAULT_REGION", "us-east-1")
            mp.setenv("AWS_ENDPOINT_URL", endpoint)
            # A developer's own AWS settings must not redirect the tests to a real account.
            for name in ("AWS_ENDPOINT_URL_S3", "AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_REGION"):
                mp.delenv(name, raising=False)
            yield endpoint
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()


@pytest.fixture
def s3_bucket(moto_s3: str) -> Iterator[str]:
    """A new, empty bucket: `s3://<name>`."""
    import s3fs

    # s3fs caches filesystem instances (and their directory listings) across tests.
    s3fs.S3FileSystem.clear_instance_cache()
    name = f"test-{uuid.uuid4().hex[:16]}"
    s3fs.S3FileSystem(endpoint_url=moto_s3).mkdir(name)
    yield f"s3://{name}"
    s3fs.S3FileSystem.clear_instance_cache()


@pytest.fixture(params=["local", pytest.param("s3", marks=pytest.mark.s3)])
def storage_uri(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A storage root: a temporary local folder, then an S3 bucket."""
    if request.param == "local":
        return str(tmp_path / "store")
    return request.getfixturevalue("s3_bucket")
