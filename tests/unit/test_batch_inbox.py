"""Batches staged on a rank ahead of the call that trains on them (infra/trainer/batch_inbox.py)."""

from __future__ import annotations

import threading
import time

import pytest
import ray

from infra.cluster.ray_cluster import runtime_env
from infra.config import RunConfig
from infra.rollout.batch import RolloutBatch, Sample
from infra.system import actor_class
from infra.trainer.batch_inbox import BatchInbox, FromManager
from infra.trainer.fsdp_rank import FSDPRank


def _batch(rollout_id: int) -> RolloutBatch:
    sample = Sample("p", "l", "r", [1, 2], [3], [-0.5], weight_version=rollout_id, group=0)
    return RolloutBatch(rollout_id, [sample])


class _Source:
    """Stands where the rollout manager is: counts the fetches."""

    def __init__(self) -> None:
        self.fetched: list[int] = []

    def fetch(self, rollout_id: int) -> RolloutBatch:
        self.fetched.append(rollout_id)
        return _batch(rollout_id)


def test_a_staged_batch_is_taken_without_a_fetch_and_kept_for_the_same_rollout():
    inbox, source, staged = BatchInbox(), _Source(), _batch(3)
    inbox.put(3, staged)
    assert inbox.take(3, source) is staged
    assert inbox.take(3, source) is staged  # the critic: values, then its step, on one batch
    assert source.fetched == [] and inbox.state() == {"held": [3], "staged": 2, "fetched": 0}


def test_a_batch_never_staged_is_fetched_once():
    inbox, source = BatchInbox(), _Source()
    first = inbox.take(5, source)
    assert first.rollout_id == 5 and inbox.take(5, source) is first
    assert source.fetched == [5]


def test_a_batch_passed_with_the_call_is_used_as_it_is():
    inbox, direct = BatchInbox(), _batch(1)
    inbox.put(1, _batch(1))
    assert inbox.take(1, direct) is direct


def test_take_waits_for_a_batch_on_its_way_instead_of_fetching_it_again():
    inbox, source, staged = BatchInbox(), _Source(), _batch(7)
    inbox.announce(7)
    threading.Timer(0.3, inbox.put, args=(7, staged)).start()
    t0 = time.monotonic()
    assert inbox.take(7, source) is staged
    assert time.monotonic() - t0 >= 0.25 and source.fetched == []


def test_a_failed_stage_leaves_the_batch_to_the_fetch():
    inbox, source = BatchInbox(), _Source()
    inbox.announce(2)
    inbox.put(2, None)
    assert inbox.take(2, source).rollout_id == 2 and source.fetched == [2]


def test_at_most_two_batches_are_held_the_oldest_goes_when_one_arrives():
    inbox, source = BatchInbox(), _Source()
    for k in (0, 1, 2):  # rollout 0 was never taken (a rank that sat it out)
        inbox.put(k, _batch(k))
    assert inbox.state()["held"] == [1, 2]
    inbox.take(2, source)  # taking frees nothing: that is left to the staging thread
    assert inbox.state()["held"] == [1, 2] and source.fetched == []
    inbox.take(3, source)  # a fetched batch is kept like a staged one
    assert inbox.state()["held"] == [2, 3] and source.fetched == [3]


class _Holder:
    """Holds batches in the object store and answers with their refs, as the manager does."""

    def __init__(self) -> None:
        self.refs: dict[int, ray.ObjectRef] = {}

    def make(self, rollout_id: int) -> None:
        self.refs[rollout_id] = ray.put(_batch(rollout_id))

    def batch_ref(self, rollout_id: int) -> ray.ObjectRef:
        return self.refs[rollout_id]


class _BusyRank(FSDPRank):
    """An FSDP rank's batch staging without a model: `train` stands for a long step."""

    def train(self, seconds: float) -> list[int]:
        time.sleep(seconds)
        return self.inbox.state()["held"]


@pytest.fixture(scope="module")
def local_ray():
    ray.init(num_cpus=1, include_dashboard=False, runtime_env=runtime_env("", {}))  # the repo on the path
    yield
    ray.shutdown()


def test_a_rank_receives_a_batch_while_its_main_thread_trains(local_ray):
    """The batch arrives in the rank's stage thread during a step: the step, still running
    when it was sent, already holds it when it ends."""
    rank = actor_class(_BusyRank).options(num_cpus=0).remote(RunConfig(), 0, 1)  # as RLSystem does
    holder = ray.remote(_Holder).options(num_cpus=0).remote()
    ray.get([rank.pid.remote(), holder.make.remote(4)])  # both up before the step
    step = rank.train.remote(2.0)
    time.sleep(0.3)  # the step has begun
    staged = rank.stage_batch.remote(4, FromManager(holder))
    ray.get(staged, timeout=1.5)  # returns while the step still sleeps
    assert ray.get(step) == [4]
    assert ray.get(rank.inbox_state.remote()) == {"held": [4], "staged": 0, "fetched": 0}
