"""DCP checkpoints on S3 through infra.storage.dcp_io: a round trip is exact, and a write
to a bucket that does not exist fails instead of creating the bucket."""

from __future__ import annotations

import uuid

import pytest
import s3fs
import torch
import torch.distributed.checkpoint as dcp

from infra.storage.dcp_io import BackgroundSave, checkpoint_reader, checkpoint_writer, save_state

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


def test_background_save_writes_the_state_of_its_call(s3_bucket, moto_s3):
    opts = {"endpoint_url": moto_s3}
    state = {"w": torch.randn(64, 8)}
    expected = state["w"].clone()
    uri = f"{s3_bucket}/run/checkpoints/iter_0000002/model"
    writing = BackgroundSave(state, uri, opts, group=None)
    state["w"].add_(1.0)  # training goes on: the staged copy is what gets written
    assert writing.wait() == uri
    loaded = {"w": torch.zeros(64, 8)}
    dcp.load(loaded, storage_reader=checkpoint_reader(uri, opts))
    assert torch.equal(loaded["w"], expected)


def test_a_failed_background_write_raises_a_plain_error_on_wait(moto_s3):
    s3fs.S3FileSystem.clear_instance_cache()
    bucket = f"gone-{uuid.uuid4().hex[:12]}"
    writing = BackgroundSave({"w": torch.ones(2)}, f"s3://{bucket}/m", {"endpoint_url": moto_s3}, group=None)
    with pytest.raises(FileNotFoundError, match=rf"checkpoint write to s3://{bucket}/m"):
        writing.wait()
