"""The actor/critic handoff of the rollout manager: waits for posts, drops a rollout's posts
only when all its consumers are done, and names what never came."""

import threading
import time

import pytest

from infra.rollout.handoff import Handoff


def _consumers(rollout_id: int) -> set[str]:
    return {"critic"} if rollout_id == 0 else {"actor", "critic"}  # iteration 0: critic-only


def test_a_waiter_gets_what_is_posted_later():
    box = Handoff(_consumers)
    got = []
    waiter = threading.Thread(target=lambda: got.append(box.wait(3, "values", timeout_s=10)))
    waiter.start()
    time.sleep(0.1)
    box.post(3, "values", [[0.5, 0.25]])
    waiter.join(5)
    assert got == [[[0.5, 0.25]]]
    assert box.wait(3, "values", timeout_s=0) == [[0.5, 0.25]]  # the actor's ranks all read it


def test_posts_go_when_every_consumer_is_done():
    box = Handoff(_consumers)
    box.post(1, "values", [1.0])
    assert box.done(1, "actor") is False  # the critic still trains on rollout 1
    assert box.wait(1, "values", timeout_s=0) == [1.0]
    assert box.done(1, "critic") is True
    with pytest.raises(TimeoutError, match="rollout 1: no values posted"):
        box.wait(1, "values", timeout_s=0.05)
    assert box.done(0, "critic") is True  # a critic-only iteration has no actor to wait for
