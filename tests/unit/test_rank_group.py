"""RankGroup on real Ray actors: one call per rank, results in rank order, rank 0's answer,
and a dead rank named by its role and number at once."""

from __future__ import annotations

import os
import signal
import time

import pytest
import ray

from infra.cluster.rank_group import RankGroup, TrainerRankDied
from infra.cluster.ray_cluster import runtime_env


@ray.remote(num_cpus=0)
class Rank:
    def __init__(self, rank: int) -> None:
        self.rank = rank

    def whoami(self, tag: str) -> tuple[int, str]:
        return self.rank, tag

    def pid(self) -> int:
        return os.getpid()

    def slow(self, seconds: float) -> int:
        time.sleep(seconds)
        return self.rank


@pytest.fixture(scope="module")
def ray_local():
    ray.init(num_cpus=1, include_dashboard=False, runtime_env=runtime_env("", {}))
    yield
    ray.shutdown()


def test_call_returns_every_rank_in_order_and_rank0_speaks_for_the_group(ray_local):
    group = RankGroup([Rank.remote(r) for r in range(3)], "trainer")
    assert len(group) == 3 and group[0] is group.ranks[0]
    assert group.call("whoami", "x") == [(0, "x"), (1, "x"), (2, "x")]
    assert group.rank0("whoami", tag="y") == (0, "y")
    assert [r for r, _ in ray.get(group.refs("whoami", "z"))] == [0, 1, 2]


def test_a_dead_rank_is_named_by_role_and_number_before_the_others_finish(ray_local):
    group = RankGroup([Rank.remote(r) for r in range(2)], "critic")
    pids = group.call("pid")
    os.kill(pids[1], signal.SIGKILL)
    t0 = time.monotonic()
    with pytest.raises(TrainerRankDied, match=r"critic rank 1 died during the slow step"):
        # rank 0 would answer only after 60 s; the dead rank 1 is reported at once
        group.call("slow", 60, what="the slow step")
    assert time.monotonic() - t0 < 30


def test_an_empty_group_calls_nothing(ray_local):
    assert RankGroup([], "critic").call("anything") == []
