"""The rollout manager scores an engine's samples as soon as that engine replies, while
the others still generate, and the batch is the same as if it had waited for all of them."""

from __future__ import annotations

import asyncio
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest

from bench.sim_engine import SimSpec, serve
from infra.config import RunConfig, TinyModelConfig
from infra.model.tiny import build_tiny_model
from infra.rollout.manager import RolloutManager

SPEC = SimSpec(median_tokens=8, slots=4, slot_tokens_per_s=2000)
SCORED = threading.Event()  # set by the first reward call


def signalling_reward(prompt: str, response: str, label: str, **kw) -> float:
    SCORED.set()
    return float(len(response))


class HeldEngine(ThreadingHTTPServer):
    """An engine whose /generate answers only once a reward has been computed (or after
    `hold_s`), relaying a simulated engine's reply; it notes which of the two happened."""

    def __init__(self, upstream: str, hold_s: float):
        self.upstream, self.hold_s, self.released_by_reward = upstream, hold_s, []
        super().__init__(("127.0.0.1", 0), _Relay)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _Relay(BaseHTTPRequestHandler):
    server: HeldEngine

    def do_GET(self) -> None:  # /health, probed while a request is out
        self._answer(httpx.get(self.server.upstream + self.path).content)

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        if self.path == "/generate":
            self.server.released_by_reward.append(SCORED.wait(self.server.hold_s))
        self._answer(httpx.post(self.server.upstream + self.path, content=body, timeout=30).content)

    def _answer(self, content: bytes) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(content)))
        self.end_headers()
        self.wfile.write(content)

    def log_message(self, *args) -> None:
        pass


@pytest.fixture(scope="module")
def sim_urls():
    loop = asyncio.new_event_loop()
    threading.Thread(target=loop.run_forever, daemon=True).start()
    yield asyncio.run_coroutine_threadsafe(serve(SPEC, 2), loop).result(timeout=30)
    loop.call_soon_threadsafe(loop.stop)


def test_an_early_reply_is_scored_before_the_last_reply_arrives(sim_urls, tmp_path):
    held = HeldEngine(sim_urls[1], hold_s=30)  # without the overlap it answers only after 30 s
    threading.Thread(target=held.serve_forever, daemon=True).start()
    try:
        model = build_tiny_model(tmp_path / "model", TinyModelConfig())
        cfg = RunConfig.model_validate(
            {
                "rollout": {
                    "prompts_per_rollout": 4,
                    "n_samples_per_prompt": 3,
                    "sampling": {"max_new_tokens": 64},
                },
                "data": {"reward": f"{__name__}:signalling_reward", "reward_isolation": "thread"},
                "storage": {"uri": str(tmp_path)},
            }
        )
        SCORED.clear()
        manager = RolloutManager(cfg, [sim_urls[0], held.url], str(model))
        manager.generate(0)
    finally:
        held.shutdown()
    assert held.released_by_reward == [True]  # engine 0's samples were scored first
    # the batch is in sample order, each sample with its own reward, whichever reply came first
    samples = manager.get_batch(0).samples
    seed = cfg.rollout.seed * 2**40
    assert [len(s.response_ids) for s in samples] == [min(SPEC.length(seed + j), 64) for j in range(12)]
    assert [s.group for s in samples] == [j // 3 for j in range(12)]
    assert [s.reward for s in samples] == [float(len(s.response)) for s in samples]
