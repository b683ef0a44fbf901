"""One EngineClient keeps its connections: successive calls reuse one, and calls from
several threads at once each get their own."""

from __future__ import annotations

import json
import threading
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from infra.engines.client import EngineClient


class Recorder(ThreadingHTTPServer):
    """Answers /health and /model_info; notes the client port of every request. /model_info
    answers only once two of them are in, so it needs two requests at once."""

    def __init__(self):
        self.ports: list[int] = []
        self.both_in = threading.Barrier(2, timeout=10)
        super().__init__(("127.0.0.1", 0), _Handler)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as uvicorn and aiohttp serve
    server: Recorder

    def do_GET(self) -> None:
        self.server.ports.append(self.client_address[1])
        if self.path == "/model_info":
            self.server.both_in.wait()
        body = json.dumps({"weight_version": "3"}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def server():
    srv = Recorder()
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield srv
    srv.shutdown()
    srv.server_close()


def test_successive_calls_reuse_one_connection(server):
    with EngineClient(f"http://127.0.0.1:{server.server_address[1]}") as client:
        assert client.health() and client.health() and client.health()
    assert len(server.ports) == 3 and len(set(server.ports)) == 1


def test_calls_from_threads_run_at_once_on_their_own_connections(server):
    url = f"http://127.0.0.1:{server.server_address[1]}"
    with EngineClient(url) as client, ThreadPoolExecutor(2) as pool:
        versions = list(pool.map(lambda _: client.weight_version(), range(2)))
    assert versions == ["3", "3"]  # neither waited behind the other (the barrier needs both)
    assert len(set(server.ports)) == 2
