"""The built-in engine under hostile or careless clients: a real server process with a
per-run API key, hundreds of malformed requests (hypothesis), oversized work refused by
the model's positions, a dropped client whose generation is cancelled, and a health
check that turns 503 when generation stops making progress."""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from infra.config import TinyModelConfig
from infra.engines.client import EngineClient, EngineError
from infra.engines.launch import launch_engine, stop_engine, wait_until_healthy
from infra.model.tiny import build_tiny_model
from infra.secrets import API_KEY_ENV
from tests.ports import free_port

KEY = "per-run-key-for-the-test"
AUTH = {"Authorization": f"Bearer {KEY}"}
POSITIONS = 2048


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> Iterator[str]:
    model = build_tiny_model(
        tmp_path_factory.mktemp("tiny"), TinyModelConfig(max_position_embeddings=POSITIONS)
    )
    port = free_port()
    log = tmp_path_factory.mktemp("log") / "engine.log"
    os.environ[API_KEY_ENV] = KEY  # what a run sets for all its processes
    try:
        proc = launch_engine("torch", str(model), "127.0.0.1", port, seed=0, threads=1, log_path=str(log))
    finally:
        del os.environ[API_KEY_ENV]
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_healthy(url, proc, 120)
        yield url
    finally:
        stop_engine(proc)
    assert proc.poll() is not None


def post(url: str, body, headers=AUTH, timeout: float = 60) -> httpx.Response:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    return httpx.post(
        f"{url}/generate",
        content=data,
        headers={**headers, "content-type": "application/json"},
        timeout=timeout,
    )


def ok_body(**sampling) -> dict:
    return {
        "input_ids": [[5, 6, 7]],
        "sampling_params": {"max_new_tokens": 2, **sampling},
        "return_logprob": True,
    }


def test_requests_need_the_run_key(server, monkeypatch):
    assert post(server, ok_body(), headers={}).status_code == 401
    assert post(server, ok_body(), headers={"Authorization": "Bearer wrong"}).status_code == 401
    assert httpx.get(f"{server}/health").status_code == 200  # probes need no key
    assert post(server, ok_body()).status_code == 200
    monkeypatch.setenv(API_KEY_ENV, KEY)  # the client sends the run's key from the environment
    assert len(EngineClient(server).generate([[5, 6]], {"max_new_tokens": 1})) == 1
    monkeypatch.delenv(API_KEY_ENV)
    with pytest.raises(EngineError, match="401"):
        EngineClient(server).generate([[5, 6]], {"max_new_tokens": 1})


def test_work_beyond_the_model_is_refused(server):
    cases = {
        "sampling_params.max_new_tokens": ok_body(max_new_tokens=10**12),
        "input_ids": {"input_ids": [5] * (POSITIONS + 1), "sampling_params": {"max_new_tokens": 1}},
        "sampling_params.n": ok_body(n=10**6),
        "sampling_params.sampling_seed": ok_body(sampling_seed=2**70),
    }
    for field, body in cases.items():
        resp = post(server, body)
        assert resp.status_code == 400, (field, resp.text)
        assert field in resp.json()["message"], (field, resp.text)
    # 5 x 1000 sequences pass the per-field cap but not the per-request one
    resp = post(server, {"input_ids": [[5]] * 5, "sampling_params": {"n": 1000, "max_new_tokens": 1}})
    assert resp.status_code == 400 and "sequences per request" in resp.json()["message"]


def test_a_dropped_client_cancels_its_generation(server):
    huge = {
        "input_ids": [[5, 6]],
        "sampling_params": {"n": 256, "max_new_tokens": POSITIONS - 4, "ignore_eos": True},
    }
    # about 500k tokens (tens of seconds here); the client gives up after 1 s and hangs up
    with pytest.raises(httpx.ReadTimeout):
        post(server, huge, timeout=1.0)
    t0 = time.monotonic()
    assert post(server, ok_body()).status_code == 200  # waits only for the cancelled batch's next step
    assert time.monotonic() - t0 < 15


def test_malformed_requests_leave_the_server_healthy(server):
    for body in (b"{not json", b"", b"[]", b"null", b'{"input_ids": "abc"}'):
        resp = post(server, body)
        assert 400 <= resp.status_code < 500 and resp.json()["message"], resp.text
    assert httpx.get(f"{server}/health").json() == {"status": "ok"}


# ---- property-based: every malformed /generate gets a 4xx naming what is wrong ----------

_junk = st.one_of(
    st.none(),
    st.booleans(),
    st.text(max_size=5),
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(min_value=-(2**80), max_value=2**80),
    st.lists(st.integers(min_value=-5, max_value=5), max_size=3),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
)
_BROKEN = {
    # (where, value) that is invalid whatever else the request holds
    "unknown_top": st.tuples(st.just(("bogus_field",)), _junk),
    "unknown_sampling": st.tuples(st.just(("sampling_params", "min_p")), _junk),
    "max_new_tokens": st.tuples(
        st.just(("sampling_params", "max_new_tokens")),
        st.one_of(
            st.integers(max_value=-1),
            st.integers(min_value=POSITIONS),
            st.text(alphabet="abcxyz", min_size=1),
            st.lists(st.integers()),
        ),
    ),
    "n": st.tuples(
        st.just(("sampling_params", "n")), st.one_of(st.integers(max_value=0), st.integers(min_value=1025))
    ),
    "temperature": st.tuples(st.just(("sampling_params", "temperature")), st.floats(max_value=-1e-9)),
    "top_p": st.tuples(
        st.just(("sampling_params", "top_p")), st.one_of(st.floats(max_value=0), st.floats(min_value=1.0001))
    ),
    "token_range": st.tuples(
        st.just(("input_ids",)),
        st.lists(
            st.one_of(st.integers(max_value=-1), st.integers(min_value=100_000)), min_size=1, max_size=4
        ),
    ),
    "empty_prompt": st.tuples(st.just(("input_ids",)), st.just([])),
    "rid_count": st.tuples(st.just(("rid",)), st.lists(st.text(max_size=3), min_size=2, max_size=4)),
    "stream": st.tuples(st.just(("stream",)), st.just(True)),
    "sampling_type": st.tuples(
        st.just(("sampling_params",)), st.one_of(st.integers(), st.text(), st.lists(st.none()))
    ),
    "seed": st.tuples(
        st.just(("sampling_params", "sampling_seed")),
        st.one_of(st.integers(max_value=-1), st.integers(min_value=2**63)),
    ),
}


@st.composite
def malformed(draw) -> dict:
    body = {"input_ids": [[5, 6, 7]], "sampling_params": {"max_new_tokens": 1}}
    where, value = draw(st.sampled_from(sorted(_BROKEN)).flatmap(lambda k: _BROKEN[k]))
    node = body
    for key in where[:-1]:
        node = node[key]
    node[where[-1]] = value
    return body


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(body=malformed())
def test_property_malformed_generate_gets_4xx_with_a_message(server, body):
    resp = post(server, body)
    assert 400 <= resp.status_code < 500, (body, resp.status_code, resp.text)
    message = resp.json()["message"]
    assert isinstance(message, str) and message, body


def test_server_healthy_after_the_property_test(server):
    assert httpx.get(f"{server}/health").json() == {"status": "ok"}
    assert post(server, ok_body()).status_code == 200


def test_health_turns_503_when_generation_stalls(tmp_path):
    """In-process app over a real EngineState: a weight update that never finishes holds the
    model lock, so generation cannot run, and /health must say so."""
    from fastapi.testclient import TestClient

    from infra.engine_server.engine_state import EngineState
    from infra.engine_server.server import create_app

    model = build_tiny_model(tmp_path / "m", TinyModelConfig())
    state = EngineState(str(model), seed=0, weight_version="0")
    app = create_app(state, stall_s=1.0)
    with TestClient(app) as http:
        assert http.get("/health").status_code == 200
        state.lock.acquire()  # a stuck weight update
        try:
            waiting = threading.Thread(target=lambda: http.post("/generate", json=ok_body()))
            waiting.start()
            time.sleep(2.0)
            resp = http.get("/health")
            assert resp.status_code == 503 and "no generation progress" in resp.json()["message"]
        finally:
            state.lock.release()
        waiting.join(30)
        assert http.get("/health").status_code == 200


def test_server_refuses_hub_downloads():
    src = (Path(__file__).resolve().parents[2] / "infra" / "engine_server" / "server.py").read_text()
    # the switch is set before any model is loaded
    assert src.index('os.environ["HF_HUB_OFFLINE"] = "1"') < src.index("state = EngineState(")


def test_hung_group_joins_do_not_starve_generation(server):
    """Weight-group joins to a port where nobody listens block for the group timeout; they
    run on threads of their own, so /generate, /health and the other routes keep answering."""
    closed = free_port()
    body = {"master_address": "127.0.0.1", "master_port": closed, "rank_offset": 1, "world_size": 2}
    joins = [
        threading.Thread(
            target=lambda i=i: _quietly(
                lambda: httpx.post(
                    f"{server}/init_weights_update_group",
                    json={**body, "group_name": f"g{i}"},
                    headers=AUTH,
                    timeout=3,
                )
            ),
            daemon=True,
        )
        for i in range(12)
    ]
    for t in joins:
        t.start()
    time.sleep(1.0)
    t0 = time.monotonic()
    assert post(server, ok_body(), timeout=30).status_code == 200
    assert time.monotonic() - t0 < 20
    assert httpx.get(f"{server}/health").json() == {"status": "ok"}
    # nor the routes that run on the default threads (joins have their own)
    weights = httpx.post(
        f"{server}/get_weights_by_name", json={"name": "model.norm.weight"}, headers=AUTH, timeout=10
    )
    assert weights.status_code == 200


def _quietly(fn) -> None:
    with contextlib.suppress(httpx.HTTPError):
        fn()


def test_a_group_join_without_peers_gives_up_after_its_timeout(tmp_path):
    """A join whose trainer never comes frees its thread after --group-timeout-s."""
    from fastapi.testclient import TestClient

    from infra.engine_server.engine_state import EngineState
    from infra.engine_server.server import create_app
    from tests.ports import free_port

    model = build_tiny_model(tmp_path / "m", TinyModelConfig())
    state = EngineState(str(model), seed=0, weight_version="0", group_timeout_s=3.0)
    body = {"master_address": "127.0.0.1", "master_port": free_port(), "rank_offset": 1, "world_size": 2}
    with TestClient(create_app(state)) as http:
        t0 = time.monotonic()
        resp = http.post("/init_weights_update_group", json={**body, "group_name": "lonely"})
        assert resp.status_code >= 400 and resp.json()["success"] is False
        assert time.monotonic() - t0 < 60
        assert "lonely" not in state.groups
        assert http.post("/generate", json=ok_body()).status_code == 200  # still serving


# ---- bodies, paths and peers a careless client sends ------------------------------------


@pytest.mark.parametrize("body", [b"{", b"[1]", b"null", b'"name"', b'{"name": 3}', b'{"nme": "x"}'])
def test_malformed_get_weights_by_name_is_a_400(server, body):
    resp = httpx.post(
        f"{server}/get_weights_by_name",
        content=body,
        headers={**AUTH, "content-type": "application/json"},
        timeout=30,
    )
    assert resp.status_code == 400, resp.text
    assert resp.json()["message"].startswith(("body", "name")), resp.text


@pytest.mark.parametrize("path", ["/etc", "/etc/passwd", "/no/such/dir", "gpt2", ""])
def test_update_from_a_path_that_is_no_model_is_a_400(server, path):
    resp = httpx.post(
        f"{server}/update_weights_from_disk", json={"model_path": path}, headers=AUTH, timeout=30
    )
    assert resp.status_code == 400, resp.text
    assert "model_path" in resp.json()["message"] and "not an HF model directory" in resp.json()["message"]


def _health_latencies(url: str, until: threading.Event) -> list[float]:
    latencies = []
    while not until.is_set():
        t0 = time.monotonic()
        assert httpx.get(f"{url}/health", timeout=10).status_code == 200
        latencies.append(time.monotonic() - t0)
        time.sleep(0.02)
    return latencies


@pytest.mark.parametrize("chunked", [False, True])
def test_an_oversized_body_is_refused_unparsed_while_health_answers(server, chunked):
    # 10 MB of ids: above the default limit (6 MiB); parsing it would take seconds and GBs
    big = json.dumps({"input_ids": [[123] * 1000 for _ in range(2500)]}).encode()
    assert len(big) > 6 * 2**20
    content = iter([big[i : i + 2**20] for i in range(0, len(big), 2**20)]) if chunked else big
    done = threading.Event()
    result: dict = {}

    def send() -> None:
        t0 = time.monotonic()
        result["resp"] = httpx.post(
            f"{server}/generate",
            content=content,
            headers={**AUTH, "content-type": "application/json"},
            timeout=30,
        )
        result["seconds"] = time.monotonic() - t0
        done.set()

    sender = threading.Thread(target=send)
    sender.start()
    latencies = _health_latencies(server, done)
    sender.join()
    resp = result["resp"]
    assert resp.status_code == 413, resp.text
    assert "exceed the engine's limit of 6291456" in resp.json()["message"]
    assert result["seconds"] < 5
    assert latencies and max(latencies) < 1.0, latencies
    assert post(server, ok_body()).status_code == 200  # and it still serves


def test_request_limits_in_process(tmp_path):
    """Token and body limits are the server's options; bad long lists fail on their first item."""
    from fastapi.testclient import TestClient

    from infra.engine_server.engine_state import EngineState
    from infra.engine_server.protocol import default_body_limit
    from infra.engine_server.server import create_app

    assert default_body_limit(2**19) == 6 * 2**20
    model = build_tiny_model(tmp_path / "m", TinyModelConfig())
    state = EngineState(str(model), seed=0, weight_version="0")
    with TestClient(create_app(state, max_request_tokens=50, max_body_bytes=4000)) as http:
        over = http.post("/generate", json={"input_ids": [[5] * 30, [6] * 21]})
        assert over.status_code == 400 and "51 prompt tokens exceed the request limit of 50" in over.text
        text = http.post("/generate", json={"text": ["a" * 40, "b" * 11]})
        assert text.status_code == 400 and "text: 51 characters exceed" in text.text
        body = http.post("/generate", content=b" " * 4001, headers={"content-type": "application/json"})
        assert body.status_code == 413 and "limit of 4000" in body.text
        ok = http.post("/generate", json={"input_ids": [[5] * 20], "sampling_params": {"max_new_tokens": 1}})
        assert ok.status_code == 200
    with TestClient(create_app(state)) as http:
        t0 = time.monotonic()
        bad = http.post("/generate", json={"input_ids": [["x"] * 100 for _ in range(2000)]})
        assert time.monotonic() - t0 < 5
        assert bad.status_code == 400 and len(bad.json()["message"]) < 1000, bad.text[:300]
        zero_k = http.post("/generate", json=ok_body(top_k=0))
        assert zero_k.status_code == 400 and "sampling_params.top_k" in zero_k.text


@pytest.mark.parametrize("address", ["127.0.0.1", "10.255.255.1"])
def test_a_join_to_a_dead_master_fails_within_the_group_timeout_naming_it(tmp_path, address):
    from fastapi.testclient import TestClient

    from infra.engine_server.engine_state import EngineState
    from infra.engine_server.server import create_app

    model = build_tiny_model(tmp_path / "m", TinyModelConfig())
    state = EngineState(str(model), seed=0, weight_version="0", group_timeout_s=2.0)
    port = free_port()
    body = {"master_address": address, "master_port": port, "rank_offset": 1, "world_size": 2}
    with TestClient(create_app(state)) as http:
        t0 = time.monotonic()
        resp = http.post("/init_weights_update_group", json=body)
        assert time.monotonic() - t0 < 2.0 + 3
        assert resp.status_code == 504, resp.text
        assert f"the master {address}:{port} did not accept a connection" in resp.json()["message"]
        assert "group timeout of 2 s" in resp.json()["message"]
        assert not state.groups
