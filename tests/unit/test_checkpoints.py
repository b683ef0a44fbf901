"""The checkpoint commit protocol, on a local folder and on S3 (moto)."""

import pytest

from infra.config import RunConfig, StorageConfig
from infra.storage.checkpoints import MARKER, CheckpointStore, config_hash, read_committed_meta
from infra.storage.fs import RunStore, storage_options


def make(storage_uri, keep_last=2):
    store = RunStore(StorageConfig(uri=storage_uri), "run")
    return store, CheckpointStore(store, keep_last=keep_last)


def fake_save(store, ckpts, k):
    path = ckpts.begin(k)
    rel = path[len(store.run_uri) + 1 :]
    store.write_text(f"{rel}/model/shard.distcp", f"weights {k}")
    return ckpts.commit(k, {"rollout_id": k, "next_rollout_id": k + 1})


def test_commit_marker_latest_and_retention(storage_uri):
    store, ckpts = make(storage_uri, keep_last=2)
    assert ckpts.latest() is None
    for k in (0, 1, 2):
        uri = fake_save(store, ckpts, k)
        assert ckpts.latest() == k
        assert store.read_text("checkpoints/latest") == f"iter_{k:07d}"
        assert read_committed_meta(uri, store.options)["next_rollout_id"] == k + 1
    assert ckpts.committed() == [1, 2]  # keep_last=2 removed iteration 0
    assert not store.exists("checkpoints/iter_0000000")


def test_partial_checkpoint_is_never_loaded_and_is_cleaned(storage_uri):
    store, ckpts = make(storage_uri)
    fake_save(store, ckpts, 3)
    # a save of iteration 5 that died before its marker
    store.write_text("checkpoints/iter_0000005/model/shard.distcp", "half")
    store.write_text("checkpoints/iter_0000005/meta.json", "{}")
    assert ckpts.latest() == 3
    with pytest.raises(FileNotFoundError, match=MARKER):
        read_committed_meta(ckpts.uri(5), store.options)
    fake_save(store, ckpts, 6)
    assert not store.exists("checkpoints/iter_0000005")
    assert ckpts.committed() == [3, 6]
    assert store.read_text("checkpoints/iter_0000003/model/shard.distcp") == "weights 3"


def test_config_hash_tracks_what_is_trained():
    base = RunConfig()
    assert config_hash(base) == config_hash(RunConfig(num_rollout=99, run_name="other"))
    assert config_hash(base) != config_hash(RunConfig.model_validate({"algorithm": {"lr": 1e-4}}))
    assert config_hash(base) != config_hash(RunConfig.model_validate({"data": {"shuffle_seed": 1}}))


def test_storage_options_never_carry_credentials(moto_s3):
    opts = storage_options(StorageConfig(uri="s3://b"))
    assert opts["endpoint_url"] == moto_s3
    assert "testing" not in repr(opts)
