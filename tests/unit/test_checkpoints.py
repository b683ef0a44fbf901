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


def test_background_save_commits_only_when_every_rank_wrote_it(storage_uri):
    """A pending checkpoint (meta, shards being written, no marker) is never a resume point;
    it is committed only once every rank reports its write of that folder durable."""
    store, ckpts = make(storage_uri, keep_last=None)
    fake_save(store, ckpts, 1)
    path = ckpts.begin(3)
    ckpts.mark_pending(3, {"rollout_id": 3, "next_rollout_id": 4, "run_id": "this-run"})
    store.write_text("checkpoints/iter_0000003/model/shard.distcp", "weights 3")
    shards = ckpts.model_uri(path)
    assert ckpts.pending("this-run") == [3] and ckpts.pending("other-run") == []
    assert not ckpts.is_committed(3) and ckpts.latest() == 1  # a resume now takes iteration 1
    assert ckpts.commit_written("this-run", [shards, None]) is None  # rank 1 still writing
    assert ckpts.commit_written("this-run", [ckpts.model_uri(ckpts.uri(1)), shards]) is None
    assert ckpts.commit_written("other-run", [shards, shards]) is None  # not that run's save
    assert not ckpts.is_committed(3)
    assert ckpts.commit_written("this-run", [shards, shards + "/critic"]) == 3
    assert ckpts.is_committed(3) and ckpts.latest() == 3 and ckpts.pending("this-run") == []
    assert read_committed_meta(ckpts.uri(3), store.options)["next_rollout_id"] == 4


def test_a_run_killed_before_the_commit_resumes_from_the_previous_checkpoint(storage_uri):
    from infra.storage.run_folder import resume_point

    store, ckpts = make(storage_uri, keep_last=None)
    cfg = RunConfig(storage={"uri": storage_uri}, run_name="run", checkpoint={"resume": "auto"})
    for k in (1, 3):
        path = ckpts.begin(k)
        meta = {
            "rollout_id": k,
            "next_rollout_id": k + 1,
            "run_id": "killed",
            "config_hash": config_hash(cfg),
        }
        ckpts.mark_pending(k, meta)
        store.write_text(f"checkpoints/iter_{k:07d}/model/shard.distcp", f"weights {k}")
        if k == 1:  # written and committed; iteration 3's process died before its commit
            assert ckpts.commit_written("killed", [ckpts.model_uri(path)] * 2) == 1
    uri, meta = resume_point(cfg, store)
    assert uri == ckpts.uri(1) and meta["next_rollout_id"] == 2
    # the resumed run (another run id) never commits the dead run's folder; its next save cleans it
    assert ckpts.commit_written("resumed", [ckpts.model_uri(ckpts.uri(3))] * 2) is None
    ckpts.begin(2)
    assert not store.exists("checkpoints/iter_0000003") and ckpts.committed() == [1]
