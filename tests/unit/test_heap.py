"""freeze_startup_heap: what is alive is frozen, and what is made after is still collected."""

import gc
import weakref

import pytest

from infra.heap import freeze_startup_heap


class _Node:
    def __init__(self) -> None:
        self.other: _Node | None = None


def _cycle() -> weakref.ref:
    a, b = _Node(), _Node()
    a.other, b.other = b, a
    return weakref.ref(a)


@pytest.fixture
def thawed():
    gc.unfreeze()
    yield
    gc.unfreeze()  # the rest of the test session runs with the collector as it found it


def _in_collected_generations(obj: object) -> bool:
    return any(o is obj for o in gc.get_objects())


def test_the_live_heap_is_frozen():
    alive = _Node()
    assert _in_collected_generations(alive)
    frozen = freeze_startup_heap()
    # objects frozen and later freed leave the count: in a long session it only falls after
    assert gc.get_freeze_count() <= frozen and frozen > 0
    assert not _in_collected_generations(alive)  # the collector no longer walks it


def test_cycles_made_after_the_freeze_are_still_collected(thawed):
    freeze_startup_heap()
    later = _cycle()
    gc.collect()
    assert later() is None
