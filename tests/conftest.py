"""Shared fixtures: a moto S3 server on loopback (a real S3 HTTP API, no network), a fresh
bucket per test, and `storage_uri` that runs a storage test on a local folder and on S3."""

from __future__ import annotations

import importlib.util
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from infra.storage.local_s3 import AWS_SETTINGS_TO_CLEAR, aws_env, moto_server

pytest_plugins = ["tests.run_guard", "tests.worker_groups"]


@pytest.fixture(scope="session")
def moto_s3() -> Iterator[str]:
    """Endpoint of a moto S3 server for the session, with the AWS_* env pointing at it."""
    if importlib.util.find_spec("moto") is None:
        pytest.skip("moto not installed (pip install 'moto[server]')")
    with moto_server() as endpoint, pytest.MonkeyPatch.context() as mp:
        for name, value in aws_env(endpoint).items():
            mp.setenv(name, value)
        for name in AWS_SETTINGS_TO_CLEAR:
            mp.delenv(name, raising=False)
        yield endpoint


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
