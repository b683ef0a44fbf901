"""EngineLanes: calls to one engine run in the order they were submitted, whatever became of
the one before; different engines' calls run at once; an engine's failure is an EngineError
that names it, as EngineClient's are; close ends what is still queued."""

from __future__ import annotations

import asyncio
import gc
import time
from collections.abc import Iterator
from concurrent.futures import CancelledError

import pytest

from bench.sim_engine import SimSpec, serve
from infra.engines.client import EngineClient, EngineError
from infra.engines.lanes import EngineLanes
from tests.background_loop import background_loop
from tests.ports import free_port

ANSWER_S = 0.3  # each control route's answer time on the simulated engines


@pytest.fixture(scope="module")
def urls() -> Iterator[list[str]]:
    with background_loop() as loop:
        yield asyncio.run_coroutine_threadsafe(serve(SimSpec(control_s=ANSWER_S), 8), loop).result(60)


@pytest.fixture
def lanes() -> Iterator[EngineLanes]:
    lanes = EngineLanes(8)
    yield lanes
    lanes.close()


def test_one_lane_runs_in_order_and_lanes_run_at_once(urls, lanes):
    clients = [EngineClient(url, 30) for url in urls]
    ended: list[tuple[int, str]] = []

    def step(i: int, path: str):
        async def run() -> None:
            await lanes.call(clients[i], "POST", path, {})
            ended.append((i, path))

        return run

    t0 = time.perf_counter()
    futures = [
        lanes.submit(i, step(i, p)) for p in ("/pause_generation", "/continue_generation") for i in range(8)
    ]
    for future in futures:
        future.result(timeout=30)
    elapsed = time.perf_counter() - t0
    # two calls in turn per engine, the 8 engines beside each other: 2 x ANSWER_S, not 16 x
    assert 2 * ANSWER_S <= elapsed < 6 * ANSWER_S, elapsed
    for i in range(8):
        mine = [path for j, path in ended if j == i]
        assert mine == ["/pause_generation", "/continue_generation"]


def test_a_failed_call_does_not_stop_its_lane_and_names_the_engine(urls, lanes):
    dead = EngineClient(f"http://127.0.0.1:{free_port()}", 5)  # nothing listens there
    live = EngineClient(urls[0], 30)
    failed = lanes.submit(0, lanes.call, dead, "POST", "/pause_generation", {})
    refused = lanes.submit(0, lanes.call, live, "POST", "/no_such_route", {})
    after = lanes.submit(0, lanes.call, live, "GET", "/model_info")
    with pytest.raises(EngineError, match=dead.url) as dead_error:
        failed.result(timeout=30)
    assert dead_error.value.status is None  # no answer at all
    with pytest.raises(EngineError, match="/no_such_route: HTTP 404") as refused_error:
        refused.result(timeout=30)
    assert refused_error.value.status == 404  # the engine's own answer
    data, _ = after.result(timeout=30)
    assert data["model_path"] == "simulated"


def test_a_failure_its_lane_waited_past_is_not_reported_again(urls, lanes):
    # the submitter holds the failure; a copy left unread on the loop would be logged when
    # collected, and logging from inside a collection can break whatever the collection
    # interrupted (a compile() then fails with "AST constructor recursion depth mismatch")
    reported: list[dict] = []
    lanes._loop.set_exception_handler(lambda loop, context: reported.append(context))
    dead = EngineClient(f"http://127.0.0.1:{free_port()}", 5)
    failed = lanes.submit(0, lanes.call, dead, "POST", "/pause_generation", {})
    after = lanes.submit(0, lanes.call, EngineClient(urls[0], 30), "GET", "/model_info")
    with pytest.raises(EngineError):
        failed.result(timeout=30)
    after.result(timeout=30)
    del failed  # what the lane made while waiting on it lives as long as it does
    gc.collect()
    time.sleep(0.1)  # the loop thread runs the handler it was handed
    assert reported == []


def test_close_ends_what_is_still_queued(urls):
    lanes = EngineLanes(1)
    client = EngineClient(urls[0], 30)
    running = lanes.submit(0, lanes.call, client, "POST", "/pause_generation", {})
    queued = lanes.submit(0, lanes.call, client, "POST", "/continue_generation", {})
    t0 = time.perf_counter()
    lanes.close()
    assert time.perf_counter() - t0 < ANSWER_S  # not waiting out the engine's answer
    for future in (running, queued):
        with pytest.raises(CancelledError):
            future.result(timeout=5)
    lanes.close()  # a second close does nothing
