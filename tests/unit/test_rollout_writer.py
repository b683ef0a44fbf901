from pathlib import Path

import pytest

from infra.config import StorageConfig
from infra.rollout.batch import Sample
from infra.rollout.rollout_files import read_rollout_with_stats, rollout_rel
from infra.rollout.rollout_writer import RolloutWriter
from infra.storage.fs import RunStore


def _samples(n: int) -> list[Sample]:
    return [
        Sample(
            prompt=f"{i}:",
            label=str(i),
            response="ab",
            prompt_ids=[5, 6],
            response_ids=[7, 8],
            engine_logprobs=[-0.1, -0.2],
            weight_version=2,
            group=i // 2,
            reward=float(i % 2),
        )
        for i in range(n)
    ]


def test_files_are_on_storage_once_flushed_with_the_stats_as_submitted(tmp_path):
    store = RunStore(StorageConfig(uri=str(tmp_path)), "run")
    writer = RolloutWriter(store)
    stats = {"dynamic_sampling_rounds": 2}
    uris = [writer.submit(k, _samples(4 + k), stats) for k in range(3)]
    stats["engine_restarts"] = 1  # the caller's later keys are not the file's
    writer.flush()
    assert writer.pending() == []
    for k, uri in enumerate(uris):
        assert uri == store.uri(rollout_rel(k))
        frame, stored = read_rollout_with_stats(store, k)
        assert len(frame) == 4 + k and list(frame["reward"]) == [float(i % 2) for i in range(4 + k)]
        assert stored == {"dynamic_sampling_rounds": 2}


def test_a_write_that_failed_in_the_background_is_made_again_by_flush(tmp_path):
    store = RunStore(StorageConfig(uri=str(tmp_path)), "run")
    blocker = Path(store.path("rollouts"))  # a file where the rollouts folder goes: writes fail
    blocker.parent.mkdir(parents=True)
    blocker.write_text("")
    writer = RolloutWriter(store)
    writer.submit(3, _samples(2), {})
    with pytest.raises(OSError):  # the second try fails too: the error reaches the caller
        writer.flush()
    assert writer.pending() == [3]  # its samples are kept for the next flush
    blocker.unlink()
    writer.flush()
    assert writer.pending() == []
    frame, _ = read_rollout_with_stats(store, 3)
    assert list(frame["prompt"]) == ["0:", "1:"]
