"""Group rewards (one call per prompt group) and a reward service over HTTP, the latter
against a real server on loopback that the test starts."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from infra.config import DataConfig
from infra.data.group_rewards import group_reward
from infra.data.rewards import resolve_reward, score


@group_reward
def rank_in_group(prompts, responses, labels, **kw):
    # 1 for the longest response of the group, 0 for the others: needs the whole group
    longest = max(len(r) for r in responses)
    return [float(len(r) == longest) for r in responses]


@group_reward
def broken_for_group_one(prompts, responses, labels, **kw):
    if prompts[0] == "p1":
        raise RuntimeError("judge crashed")
    return [0.5] * len(responses)


def test_group_reward_sees_each_group_once() -> None:
    items = [("p0", "a", ""), ("p0", "abc", ""), ("p1", "xy", ""), ("p1", "x", "")]
    results = score(rank_in_group, items, groups=[0, 0, 1, 1])
    assert [r.reward for r in results] == [0.0, 1.0, 1.0, 0.0]


def test_a_failing_group_fails_only_its_samples() -> None:
    items = [("p0", "a", ""), ("p1", "b", ""), ("p1", "c", "")]
    results = score(broken_for_group_one, items, groups=[0, 1, 1])
    assert [r.status for r in results] == ["completed", "failed", "failed"]
    assert "judge crashed" in results[1].error and results[0].reward == 0.5


class _Service:
    """A reward model on loopback: reward = len(response) == len(label); it records the
    batch sizes it saw, fails the first `fail_first` requests with 503, and can hang."""

    def __init__(self, fail_first: int = 0, hang_s: float = 0.0, status: int = 503) -> None:
        self.sizes: list[int] = []
        self.fail_first, self.hang_s, self.status = fail_first, hang_s, status
        self.lock = threading.Lock()
        service = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 - http.server's naming
                items = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with service.lock:
                    service.sizes.append(len(items))
                    fail = len(service.sizes) <= service.fail_first
                if service.hang_s:
                    time.sleep(service.hang_s)
                if fail:
                    self.send_response(service.status)
                    self.end_headers()
                    return
                body = json.dumps([float(len(i["response"]) == len(i["label"])) for i in items]).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}/score"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def service():
    made: list[_Service] = []

    def make(**kw) -> _Service:
        made.append(_Service(**kw))
        return made[-1]

    yield make
    for s in made:
        s.close()


ITEMS = [(f"p{i}", "x" * (i % 3), "xx") for i in range(10)]


def _reward(url: str, timeout_s: float = 10, **remote):
    data = DataConfig(reward=url, reward_timeout_s=timeout_s, remote_reward={"backoff_s": 0.01, **remote})
    return resolve_reward(data.reward, data)


def test_batches_in_order(service) -> None:
    s = service()
    results = score(_reward(s.url, batch_size=4), ITEMS, groups=list(range(10)))
    assert sorted(s.sizes) == [2, 4, 4]
    assert [r.reward for r in results] == [float(i % 3 == 2) for i in range(10)]
    assert all(r.status == "completed" for r in results)


def test_5xx_is_retried(service) -> None:
    s = service(fail_first=2)
    results = score(_reward(s.url, batch_size=10, retries=3), ITEMS)
    assert len(s.sizes) == 3 and all(r.status == "completed" for r in results)


def test_spent_retries_and_4xx_mark_samples_failed(service) -> None:
    s = service(fail_first=100)
    results = score(_reward(s.url, batch_size=5, retries=2, concurrency=1), ITEMS)
    assert len(s.sizes) == 2 * 3  # two batches, three tries each
    assert all(r.status == "failed" and "503" in r.error for r in results)
    refused = service(fail_first=100, status=422)
    score(_reward(refused.url, batch_size=10, retries=3), ITEMS)
    assert len(refused.sizes) == 1  # a refusal is not retried


def test_a_hung_service_times_out(service) -> None:
    s = service(hang_s=3)
    t0 = time.monotonic()
    results = score(_reward(s.url, timeout_s=0.5, batch_size=10, retries=0), ITEMS, timeout_s=0.5)
    assert time.monotonic() - t0 < 2.5
    assert all(r.status == "failed" for r in results)


def test_unreachable_service_fails_preflight() -> None:
    from infra.preflight import PreflightError, check_reward
    from tests.ports import free_port

    with pytest.raises(PreflightError, match="data.reward.*does not accept connections"):
        check_reward(f"http://127.0.0.1:{free_port()}/score")
