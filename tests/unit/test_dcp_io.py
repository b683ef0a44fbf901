"""DCP checkpoints on S3 through infra.storage.dcp_io: a round trip is exact, and a write
to a bucket that does not exist fails instead of creating the bucket."""

from __future__ import annotations

import uuid

import pytest
import s3fs
import torch
import torch.distributed.checkpoint as dcp

from infra.storage.dcp_io import checkpoint_reader, checkpoint_writer, save_state

pytestmark = pytest.mark.s3


def test_round_trip_on_s3(s3_bucket, moto_s3):
    state = {"w": torch.randn(4, 3), "step": torch.tensor(7)}
    uri = f"{s3_bucket}/run/checkpoints/iter_0000001/model"
    dcp.save(state, storage_writer=checkpoint_writer(uri, {"endpoint_url": moto_s3}))
    loaded = {"w": torch.zeros(4, 3), "step": torch.tensor(0)}
    dcp.load(loaded, storage_reader=checkpoint_reader(uri, {"endpoint_url": moto_s3}))
    assert torch.equal(loaded["w"], state["w"]) and loaded["step"].item() == 7


def test_a_missing_bucket_is_never_created(moto_s3):
    s3fs.S3FileSystem.clear_instance_cache()
    bucket = f"gone-{uuid.uuid4().hex[:12]}"
    # a plain, deterministic error (DCP's own CheckpointException is a BaseException)
    with pytest.raises(FileNotFoundError, match=rf"checkpoint write to s3://{bucket}/m"):
        save_state({"w": torch.ones(2)}, f"s3://{bucket}/m", {"endpoint_url": moto_s3})
    assert bucket not in [b.rstrip("/") for b in s3fs.S3FileSystem(endpoint_url=moto_s3).ls("")]


def test_local_paths_use_the_plain_writer(tmp_path):
    dcp.save({"w": torch.ones(2)}, storage_writer=checkpoint_writer(str(tmp_path / "m"), {}))
    loaded = {"w": torch.zeros(2)}
    dcp.load(loaded, storage_reader=checkpoint_reader(str(tmp_path / "m"), {}))
    assert torch.equal(loaded["w"], torch.ones(2))
