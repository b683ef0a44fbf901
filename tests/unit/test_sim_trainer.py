"""The trainer stand-in of bench/sim_trainer.py makes a weight sync's requests as the broadcast
transport's rank 0 does: every engine's in flight at once, so the sync does not grow with the
number of engines by their answer time."""

from __future__ import annotations

import asyncio
import json
import time

import pytest

from bench.sim_engine import SimSpec, serve
from bench.sim_trainer import ENV, SimTrainerRank
from infra.config import RunConfig
from infra.engines.client import EngineClient, EngineError
from tests.background_loop import background_loop
from tests.ports import free_port

ENGINES = 48  # more than a pool of 32 threads serves at once
ANSWER_S = 0.4  # each control route's answer time


@pytest.fixture(scope="module")
def loop():
    with background_loop() as running:
        yield running


@pytest.fixture(scope="module")
def urls(loop) -> list[str]:
    spec = SimSpec(control_s=ANSWER_S)
    return asyncio.run_coroutine_threadsafe(serve(spec, ENGINES), loop).result(timeout=60)


@pytest.fixture
def rank(monkeypatch: pytest.MonkeyPatch) -> SimTrainerRank:
    monkeypatch.setenv(ENV, json.dumps({"sync_s": 0.0}))
    return SimTrainerRank(RunConfig(), 0, 1)


def test_a_sync_posts_to_every_engine_at_once(urls, rank):
    rank.connect_engines(urls)
    t0 = time.perf_counter()
    out = rank.update_weights(3)
    elapsed = time.perf_counter() - t0
    # five requests per engine, in order: 5 x ANSWER_S at best; a pool of 32 threads takes
    # twice that, one engine at a time ENGINES times that
    assert elapsed < 8 * ANSWER_S, f"{elapsed:.2f} s for {ENGINES} engines"
    assert out["time_sync_s"] <= elapsed
    versions = {EngineClient(url).weight_version() for url in urls}
    assert versions == {"3"}
    rank.shutdown()


def test_an_engine_that_fails_is_named(urls, rank):
    dead = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    rank.connect_engines([*urls[:3], dead])
    with pytest.raises(EngineError, match=dead):
        rank.update_weights(4)
    rank.shutdown()
