"""The moto S3 server that the tests and the benchmarks share (infra/storage/local_s3.py)."""

from __future__ import annotations

import importlib.util
import time
import urllib.request

import pytest

from infra.storage.local_s3 import aws_env, moto_server

pytestmark = pytest.mark.skipif(importlib.util.find_spec("moto") is None, reason="moto not installed")


def test_serves_s3_then_stops() -> None:
    import boto3

    with moto_server() as endpoint:
        s3 = boto3.client("s3", endpoint_url=endpoint, **_credentials(endpoint))
        s3.create_bucket(Bucket="bucket-one")
        s3.put_object(Bucket="bucket-one", Key="k", Body=b"v")
        assert s3.get_object(Bucket="bucket-one", Key="k")["Body"].read() == b"v"
    with pytest.raises(OSError):  # the server is gone with the block
        urllib.request.urlopen(endpoint, timeout=2)


def test_a_server_that_cannot_start_fails_at_once_with_its_error() -> None:
    t0 = time.monotonic()
    # an address of no interface here (TEST-NET-3): the server's bind fails in the child at
    # once; the deadline is far beyond the child's start even on a loaded machine, so the
    # error must come from the child's exit
    failure = r"(?s)moto S3 server: exited with code 1; its output:.*Cannot assign requested address"
    with pytest.raises(RuntimeError, match=failure), moto_server(host="203.0.113.1", timeout_s=90):
        pass
    assert time.monotonic() - t0 < 60  # told when the child exits, not after the timeout


def _credentials(endpoint: str) -> dict[str, str]:
    env = aws_env(endpoint)
    return {
        "aws_access_key_id": env["AWS_ACCESS_KEY_ID"],
        "aws_secret_access_key": env["AWS_SECRET_ACCESS_KEY"],
        "region_name": env["AWS_DEFAULT_REGION"],
    }
