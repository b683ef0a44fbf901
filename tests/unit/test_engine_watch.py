"""The engine watch of the rollout manager, against a real engine server process: a killed
server is noticed at once, a frozen one within rollout.engine_health_timeout_s, and the
error names the engine's URL (here with no restarts allowed, so the fault surfaces)."""

from __future__ import annotations

import os
import signal
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from infra.config import TinyModelConfig
from infra.engines.client import EngineError
from infra.engines.fleet import EngineFleet
from infra.engines.launch import launch_engine, stop_engine, wait_until_healthy
from infra.model.tiny import build_tiny_model
from tests.ports import free_port

HEALTH_TIMEOUT_S = 3


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    # room for a request long enough to be killed in the middle of
    return build_tiny_model(tmp_path_factory.mktemp("tiny"), TinyModelConfig(max_position_embeddings=4096))


@pytest.fixture
def engine(model_dir):
    port = free_port()
    proc = launch_engine("torch", str(model_dir), "127.0.0.1", port, seed=0, threads=1)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_healthy(url, proc, 120)
        yield url, proc
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGCONT)
        stop_engine(proc)


def long_generate(client):
    # long enough that the fault lands mid-request
    return client.generate(
        [[1, 2, 3]] * 64, {"max_new_tokens": 4000, "ignore_eos": True, "stop_token_ids": []}
    )


@pytest.mark.parametrize("fault", ["SIGKILL", "SIGSTOP"])
def test_a_dead_or_frozen_engine_is_noticed_mid_request(engine, fault):
    url, proc = engine
    fleet = EngineFleet([url], 600, HEALTH_TIMEOUT_S, max_restarts=0)
    assert len(fleet.call(0, lambda c: c.generate([[1, 2]], {"max_new_tokens": 2}))) == 1
    threading.Timer(1.0, os.kill, (proc.pid, getattr(signal, fault))).start()
    t0 = time.monotonic()
    with pytest.raises(EngineError) as err:
        fleet.call(0, long_generate)
    took = time.monotonic() - t0 - 1.0
    print(f"{fault}: noticed {took:.1f}s after the fault: {err.value}")
    assert url in str(err.value) and "engine_max_restarts" in str(err.value)
    assert ("died" if fault == "SIGKILL" else "hung") in str(err.value)
    # a kill: at once; a freeze: the health timeout plus one probe's own timeout (5 s)
    assert took < (5 if fault == "SIGKILL" else HEALTH_TIMEOUT_S + 5 + 5)


class _SlowHealth(BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 - http.server's name
        time.sleep(0.4)  # a busy engine's /health
        self.send_response(200 if self.path == "/health" else 404)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


def test_the_probes_before_a_sync_go_out_at_once_and_a_silent_engine_is_named():
    servers = [ThreadingHTTPServer(("127.0.0.1", 0), _SlowHealth) for _ in range(8)]
    for server in servers:
        threading.Thread(target=server.serve_forever, daemon=True).start()
    urls = [f"http://127.0.0.1:{s.server_address[1]}" for s in servers]
    try:
        fleet = EngineFleet(urls, 60, HEALTH_TIMEOUT_S, max_restarts=0)
        t0 = time.monotonic()
        assert fleet.ensure_healthy() == 0
        assert time.monotonic() - t0 < 8 * 0.4 / 2  # one after another would take 3.2 s
        dead = f"http://127.0.0.1:{free_port()}"  # nothing listens there
        fleet = EngineFleet([*urls[:3], dead], 60, HEALTH_TIMEOUT_S, max_restarts=0)
        with pytest.raises(EngineError, match=f"engine {dead}: no /health answer; not restarted"):
            fleet.ensure_healthy()
    finally:
        for server in servers:
            server.shutdown()
