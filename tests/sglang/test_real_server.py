"""Our engine-side code against SGLang's real server (scheduler, model runner, weight updater)
on CPU: one server for the module, started by the project's launch code with an API key.

What it holds against SGLang's own server: the key is enforced and never leaves the process
(argv, log, files); a weight sync issued while a long generation runs pauses it, updates and
resumes it, quickly, without losing a sample; a session left open is recovered; the liveness
probe stays fast through minutes of saturating generation (no false restart).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future

import httpx
import psutil
import pytest
import torch

from infra.engines.client import EngineClient
from infra.engines.completions import Completion
from infra.engines.fleet import EngineFleet
from infra.weights.broadcast import BroadcastSender
from tests.sglang.servers import (
    RealServer,
    assert_no_kernel_calls,
    broadcast_sync,
    long_context_model,
    perturbed_params,
    real_sglang_server,
)

pytestmark = [pytest.mark.sglang, pytest.mark.sglang_server]

API_KEY = "sentinel-sglang-key-7f3a9c"
LONG = 400  # new tokens per sequence of the long generation (>= 200)
SYNC_TIMEOUT_S = 3  # the weight group's and each request's, as in the hang it guards against


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory):
    return long_context_model(tmp_path_factory.mktemp("long-model"))


@pytest.fixture(scope="module")
def server(sglang_python: str, model_dir, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealServer]:
    torch.set_num_threads(1)
    with real_sglang_server(sglang_python, model_dir, tmp_path_factory.mktemp("logs"), API_KEY) as srv:
        yield srv
    assert_no_kernel_calls()


def _long_generation(client: EngineClient, n: int, new_tokens: int) -> Future:
    done: Future = Future()

    def run() -> None:
        try:
            outs = client.generate(
                [[1, 20 + i % 50, 21, 22] for i in range(n)],
                {"max_new_tokens": new_tokens, "temperature": 1.0, "ignore_eos": True},
                rid=[f"long-{time.monotonic_ns()}-{i}" for i in range(n)],
            )
            done.ended_at = time.monotonic()  # set before the result: a caller of result() sees it
            done.set_result(outs)
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            done.set_exception(exc)

    threading.Thread(target=run, daemon=True).start()
    return done


def test_requests_without_the_key_get_401_and_with_it_200(server: RealServer):
    body = {"input_ids": [[1, 20, 21]], "sampling_params": {"max_new_tokens": 2}}
    with httpx.Client(timeout=30) as http:
        assert http.post(f"{server.url}/generate", json=body).status_code == 401
        assert (
            http.post(f"{server.url}/update_weights_from_disk", json={"model_path": "/"}).status_code == 401
        )
        wrong = {"Authorization": "Bearer not-the-key"}
        assert http.get(f"{server.url}/model_info", headers=wrong).status_code == 401
    assert server.client().model_info()["weight_version"] == "0"  # the run's first version


def test_sample_reads_sglangs_generate_answer_as_its_generic_json_does(server: RealServer):
    """EngineClient.sample (the rollout manager's request) decodes SGLang's own /generate
    answer into the ids, logprobs, finish reasons, rids and weight version its JSON holds."""
    body = {
        "input_ids": [[1, 20, 21], [1, 22, 23]],
        # greedy, so both requests answer the same tokens
        "sampling_params": [
            {"max_new_tokens": 6, "temperature": 0, "ignore_eos": True},
            {"max_new_tokens": 3, "temperature": 0},
        ],
        "rid": ["dec-0", "dec-1"],
        "return_logprob": True,
    }
    auth = {"Authorization": f"Bearer {API_KEY}"}
    raw = httpx.post(f"{server.url}/generate", json=body, headers=auth, timeout=120).json()
    assert len(raw) == 2 and all(out["meta_info"]["output_token_logprobs"] for out in raw)
    outs = server.client().sample(body["input_ids"], body["sampling_params"], rid=body["rid"])
    for out, want in zip(outs, raw, strict=True):
        meta = want["meta_info"]
        assert out.output_ids == want["output_ids"] and len(out.logprobs) == len(out.output_ids)
        assert out.logprobs == pytest.approx([t[0] for t in meta["output_token_logprobs"]], abs=1e-4)
        assert out.finish == meta["finish_reason"]["type"] and out.meta_info.id == meta["id"]
        assert out.meta_info.weight_version == meta["weight_version"] == "0"


def test_the_key_is_in_no_command_line_log_or_file(server: RealServer):
    tree = psutil.Process(server.proc.pid)
    for proc in [tree, *tree.children(recursive=True)]:
        assert API_KEY not in " ".join(proc.cmdline()), proc.cmdline()
    with open(server.log_path) as f:
        log = f.read()
    assert "<redacted>" in log and API_KEY not in log  # SGLang prints its arguments at start
    assert server.proc.config_dir is None  # the private config file is gone once the server is up
    assert not [a for a in server.proc.args if a.endswith("secrets.yaml") and os.path.exists(a)]


def test_a_sync_during_a_long_generation_pauses_it_and_loses_nothing(server: RealServer, model_dir):
    client = server.client()
    long = _long_generation(client, n=64, new_tokens=LONG)
    time.sleep(2.0)  # well into decoding
    assert not long.done()
    params = perturbed_params(model_dir, seed=1)
    report = broadcast_sync(server.url, model_dir, params, "11", timeout_s=SYNC_TIMEOUT_S)
    assert not long.done(), "the generation ended before the sync: make it longer"
    print(f"sync during a {LONG}-token generation: {report['seconds']:.2f} s")
    assert report["seconds"] < 10
    assert report["weights_checked"] == len(params) and report["max_abs_diff"] == 0.0
    outs = long.result(timeout=600)
    assert len(outs) == 64  # retracted, not aborted: every sequence comes back whole
    for out in outs:
        assert out["meta_info"]["finish_reason"]["type"] == "length"
        assert len(out["output_ids"]) == LONG == len(out["meta_info"]["output_token_logprobs"])
    assert client.health()
    fresh = client.generate([[1, 20, 21]], {"max_new_tokens": 3, "temperature": 0.0})
    assert fresh[0]["meta_info"]["weight_version"] == "11"


def test_a_sync_that_gave_up_leaves_no_session_in_the_way(server: RealServer, model_dir):
    """A sync that timed out after its session began (the begin answered late) leaves the
    session open; the next sync ends it and opens its own, instead of failing for good."""
    client = server.client()
    client.begin_weight_update()  # what the abandoned sync's late begin did
    report = broadcast_sync(
        server.url, model_dir, perturbed_params(model_dir, seed=2), "12", timeout_s=SYNC_TIMEOUT_S * 3
    )
    assert report["max_abs_diff"] == 0.0
    assert client.model_info()["weight_version"] == "12"


def test_a_sync_whose_session_start_answers_late_leaves_the_engine_serving(
    server: RealServer, model_dir, monkeypatch: pytest.MonkeyPatch
):
    """The fault behind an engine hung for good: a session start answered only after the
    sync gave up (injected by leaving the pause out, so the start waits behind a long
    generation). The sync fails within its timeouts, no bucket request goes out after it,
    and the engine finishes the generation, answers new requests and takes the next sync."""

    async def begin_without_pause(self: BroadcastSender, link) -> None:
        await link.begin_session(self._lanes)

    monkeypatch.setattr(BroadcastSender, "_begin", begin_without_pause)
    client = server.client()
    long = _long_generation(client, n=64, new_tokens=LONG)
    time.sleep(2.0)
    t0 = time.monotonic()
    with pytest.raises(RuntimeError):
        broadcast_sync(server.url, model_dir, perturbed_params(model_dir, seed=4), "13", SYNC_TIMEOUT_S)
    failed_after = time.monotonic() - t0
    assert failed_after < 4 * SYNC_TIMEOUT_S, failed_after
    assert len(long.result(timeout=600)) == 64
    # the fault was made: the session start waited behind the generation past the sync's own
    # timeout (the generation may end before the failed sync has cleaned up, on a fast machine)
    assert long.ended_at - t0 > SYNC_TIMEOUT_S, long.ended_at - t0
    monkeypatch.undo()
    report = broadcast_sync(server.url, model_dir, perturbed_params(model_dir, seed=5), "14", SYNC_TIMEOUT_S)
    assert report["max_abs_diff"] == 0.0
    assert client.generate([[1, 20, 21]], {"max_new_tokens": 2})[0]["meta_info"]["weight_version"] == "14"


SOAK_S = 60


def test_the_liveness_probe_stays_fast_through_saturating_generation(server: RealServer):
    """A minute of back-to-back batches (twice the fleet's health timeout), watched by the
    rollout manager's own fleet (which restarts an engine it finds dead: none may be
    restarted), while /health is timed beside them; SGLang's generating probe is timed too,
    for comparison."""
    fleet = EngineFleet([server.url], request_timeout_s=300, health_timeout_s=SOAK_S / 2, max_restarts=0)
    probe_s: list[float] = []
    generating_probe_s: list[float] = []
    stop = threading.Event()

    def probe() -> None:
        with httpx.Client(timeout=60) as http:
            while not stop.is_set():
                t0 = time.monotonic()
                assert server.client().health()
                probe_s.append(time.monotonic() - t0)
                t0 = time.monotonic()
                headers = {"Authorization": f"Bearer {server.api_key}"}
                http.get(f"{server.url}/health_generate", headers=headers)
                generating_probe_s.append(time.monotonic() - t0)
                time.sleep(0.5)

    prober = threading.Thread(target=probe, daemon=True)
    prober.start()
    t0, batches = time.monotonic(), 0
    try:
        while time.monotonic() - t0 < SOAK_S:
            outs = fleet.call(
                0,
                lambda c: c.generate(
                    [[1, 30 + i % 40, 31] for i in range(64)], {"max_new_tokens": 64, "temperature": 1.0}
                ),
            )
            assert len(outs) == 64
            batches += 1
    finally:
        stop.set()
        prober.join(60)
    print(
        f"{batches} batches in {time.monotonic() - t0:.0f} s; /health max {max(probe_s):.3f} s over "
        f"{len(probe_s)} probes; SGLang's /health_generate max {max(generating_probe_s):.2f} s"
    )
    assert fleet.restarts == [0] and not fleet.recoveries
    assert len(probe_s) > SOAK_S / 4 and max(probe_s) < 1.0  # a probe every ~2 s under load


def test_release_memory_without_the_memory_saver_is_a_no_op_answering_200(server: RealServer):
    """Why colocated GPU engines launch with --enable-memory-saver (CUDA only, so not here):
    without it SGLang answers 200 and keeps its memory, and generation goes on as before."""
    client = server.client()
    client.release_memory_occupation()
    client.resume_memory_occupation()
    assert client.generate([[1, 20, 21]], {"max_new_tokens": 2})[0]["output_ids"]


def test_over_sampling_aborts_the_straggling_group_by_its_rids(server: RealServer):
    """rollout.over_sample_prompts' abort against SGLang's own server: the straggler's
    /abort_request by exact rid ends it (a batch reply with finish `abort`), the kept groups
    are whole, and a request of someone else on the engine runs to its end."""
    from infra.rollout.over_sampling import first_groups

    fleet = EngineFleet([server.url], request_timeout_s=300, health_timeout_s=60, max_restarts=0)
    tokens = {0: 4, 1: 1000, 2: 4, 3: 4}  # group 1 fills the model's 1024-token context
    arrived: list[list[Completion]] = []

    def rids(g: int) -> list[str]:
        return [f"os-{g}-{c}" for c in range(2)]

    def request(client: EngineClient, g: int) -> list[Completion]:
        params = {"max_new_tokens": tokens[g], "temperature": 1.0, "ignore_eos": True}
        outs = client.sample([[1, 20 + g, 21], [1, 20 + g, 22]], params, rid=rids(g))
        arrived.append(outs)
        return outs

    other = _long_generation(server.client(), 2, 48)
    t0 = time.monotonic()
    kept, stats = first_groups(fleet, 4, 3, request, rids, lambda g, outs: outs)
    took = time.monotonic() - t0
    assert sorted(kept) == [0, 2, 3] and stats["over_sample_aborted_groups"] == 1
    assert all(len(out.output_ids) == 4 for g in kept for out in kept[g])
    [straggler] = [outs for outs in arrived if outs[0].meta_info.id.startswith("os-1-")]
    assert {out.finish for out in straggler} == {"abort"}
    assert all(len(out.output_ids) < 1000 for out in straggler)  # cut short
    print(f"over-sampled rollout: {took:.2f} s; the straggler made {len(straggler[0].output_ids)} tokens")
    assert all(out["meta_info"]["finish_reason"]["type"] == "length" for out in other.result(timeout=300))
