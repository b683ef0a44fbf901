"""The built-in engine server as a real process: SGLang-shaped generate, weight updates over a
weight-update group (this test process plays trainer rank 0), and process lifetime."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
import torch
from safetensors.torch import load_file

from infra.config import TinyModelConfig
from infra.engines.client import EngineClient, EngineError
from infra.engines.launch import launch_engine, stop_engine, wait_until_healthy
from infra.model.tiny import build_tiny_model
from infra.model.tokenizer import load_tokenizer
from infra.weights.broadcast import BroadcastSender, pack
from infra.weights.engines import EngineLink
from infra.weights.group import broadcast, open_update_group
from tests.ports import free_port
from tests.processes import alive

REPO = Path(__file__).resolve().parents[2]
PARAMS = ["model.layers.0.mlp.down_proj.weight", "model.norm.weight"]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # room for the long generations the abort tests cut short (the server caps by positions)
    return build_tiny_model(tmp_path_factory.mktemp("tiny"), TinyModelConfig(max_position_embeddings=32768))


@pytest.fixture(scope="module")
def server(
    model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, subprocess.Popen]]:
    torch.set_num_threads(1)
    port = free_port()
    log = str(tmp_path_factory.mktemp("log") / "engine.log")
    proc = launch_engine(
        "torch", str(model_dir), "127.0.0.1", port, seed=0, threads=1, extra_args={}, log_path=log
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_healthy(url, proc, 180)  # a loaded CI machine starts servers slowly
        yield url, proc
    finally:
        stop_engine(proc)


@pytest.fixture
def client(server) -> EngineClient:
    return EngineClient(server[0], timeout_s=60)


def _post(url: str, path: str, body: dict) -> httpx.Response:
    return httpx.post(f"{url}{path}", json=body, timeout=60)


def test_generate_single_batch_and_n(server):
    url = server[0]
    single = _post(
        url, "/generate", {"input_ids": [1, 5, 6], "sampling_params": {"max_new_tokens": 4}}
    ).json()
    assert isinstance(single, dict) and set(single) >= {"text", "output_ids", "meta_info"}
    meta = single["meta_info"]
    assert meta["finish_reason"] == {"type": "length", "length": 4}
    assert meta["prompt_tokens"] == 3 and meta["completion_tokens"] == 4 and meta["weight_version"] == "0"
    assert "output_token_logprobs" not in meta  # only with return_logprob, as in SGLang

    body = {
        "input_ids": [[1, 5], [1, 6, 7]],
        "sampling_params": {"max_new_tokens": 3, "n": 3},
        "return_logprob": True,
    }
    batch = _post(url, "/generate", body).json()
    assert [o["meta_info"]["prompt_tokens"] for o in batch] == [2, 2, 2, 3, 3, 3]  # input-major
    for out in batch:
        logprobs = out["meta_info"]["output_token_logprobs"]
        assert [t for _, t, _ in logprobs] == out["output_ids"] and all(lp < 0 for lp, _, _ in logprobs)
        assert all(text is None for _, _, text in logprobs)

    by_text = _post(url, "/generate", {"text": ["ab", "c"], "sampling_params": {"max_new_tokens": 2}}).json()
    assert [o["meta_info"]["prompt_tokens"] for o in by_text] == [2, 1]


def test_stop_token_ids_and_seed(client):
    greedy = {"max_new_tokens": 8, "temperature": 0}
    (free,) = client.generate([[1, 9, 9]], greedy)
    stop = free["output_ids"][1]
    (stopped,) = client.generate([[1, 9, 9]], {**greedy, "stop_token_ids": [stop]})
    assert (
        stopped["output_ids"][-1] == stop and len(stopped["output_ids"]) == free["output_ids"].index(stop) + 1
    )
    assert stopped["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop}
    seeded = {"max_new_tokens": 6, "sampling_seed": 11, "n": 2}
    first, again = (client.generate([[1, 4]], seeded) for _ in range(2))
    assert [o["output_ids"] for o in first] == [o["output_ids"] for o in again]
    assert [o["meta_info"]["output_token_logprobs"] for o in first] == [
        o["meta_info"]["output_token_logprobs"] for o in again
    ]


def test_reply_texts_follow_stop_trim_and_special_tokens(client, model_dir):
    # a request's texts are decoded together: as SGLang, a matched stop token is trimmed from
    # the text (not with no_stop_trim) and skip_special_tokens is honoured
    tok = load_tokenizer(str(model_dir))
    greedy = {"max_new_tokens": 8, "temperature": 0}
    (free,) = client.generate([[1, 9, 9]], greedy)
    stop = free["output_ids"][2]
    trimmed = client.generate([[1, 9, 9], [1, 9]], {**greedy, "stop_token_ids": [stop]})
    kept = client.generate([[1, 9, 9], [1, 9]], {**greedy, "stop_token_ids": [stop], "no_stop_trim": True})
    for a, b in zip(trimmed, kept, strict=True):
        assert a["output_ids"] == b["output_ids"]
        cut = a["output_ids"][:-1] if a["meta_info"]["finish_reason"]["type"] == "stop" else a["output_ids"]
        assert a["text"] == tok.decode(cut, skip_special_tokens=True)
        assert b["text"] == tok.decode(b["output_ids"], skip_special_tokens=True)
    assert trimmed[0]["text"] != kept[0]["text"]  # the first stopped at `stop`
    sampled = {"max_new_tokens": 64, "sampling_seed": 5, "ignore_eos": True, "n": 2}
    raw = client.generate([[1, 4]], {**sampled, "skip_special_tokens": False})
    skipped = client.generate([[1, 4]], {**sampled, "skip_special_tokens": True})
    assert any(set(o["output_ids"]) & set(tok.all_special_ids) for o in raw)  # the setting matters
    for a, b in zip(raw, skipped, strict=True):
        assert a["output_ids"] == b["output_ids"]
        assert a["text"] == tok.decode(a["output_ids"], skip_special_tokens=False)
        assert b["text"] == tok.decode(b["output_ids"], skip_special_tokens=True)
    assert [o["text"] for o in raw] != [o["text"] for o in skipped]


def test_get_weights_by_name_answers_leading_rows_like_sglang(server, client, model_dir):
    tensors = load_file(str(model_dir / "model.safetensors"))
    name, norm = "model.embed_tokens.weight", "model.norm.weight"
    rows = client.get_weights_by_name(name)  # truncate_size defaults to 100 rows
    assert torch.equal(torch.tensor(rows), tensors[name][:100])
    assert torch.equal(torch.tensor(client.get_weights_by_name(name, truncate_size=5)), tensors[name][:5])
    assert torch.equal(torch.tensor(client.get_weights_by_name(norm, truncate_size=5)), tensors[norm][:5])
    # SGLang's field is an int: null is refused, naming the field
    resp = _post(server[0], "/get_weights_by_name", {"name": name, "truncate_size": None})
    assert resp.status_code == 400 and "truncate_size" in resp.json()["message"]


def _join(client: EngineClient, group_name: str, pool: ThreadPoolExecutor):
    port = free_port()
    joined = pool.submit(client.init_weights_update_group, "127.0.0.1", port, 1, 2, group_name)
    group = open_update_group("127.0.0.1", port, rank=0, world_size=2, group_name=group_name, timeout_s=60)
    joined.result(timeout=60)
    return group


def _send(client, pool, group, names, tensors, group_name, version=None):
    shapes = [list(t.shape) for t in tensors]
    posted = pool.submit(
        client.update_weights_from_distributed,
        names,
        ["float32"] * len(names),
        shapes,
        group_name,
        True,
        version,
    )
    for tensor in tensors:
        broadcast(group, tensor, src=0)
    posted.result(timeout=60)


def test_weight_update_over_group(client):
    group_name = "test-group"
    with ThreadPoolExecutor(1) as pool:
        group = _join(client, group_name, pool)
        new = [torch.randn(64, 256), torch.randn(64)]
        # session on (the default, as SGLang >= 0.5.23): refused outside a session, before
        # any receive, so the group is still in step afterwards
        with pytest.raises(EngineError, match="begin_weight_update"):
            client.update_weights_from_distributed(PARAMS, ["float32"] * 2, [[64, 256], [64]], group_name)
        client.begin_weight_update()
        with pytest.raises(EngineError, match="already open"):
            client.begin_weight_update()
        _send(client, pool, group, PARAMS, new, group_name, "7")
        client.end_weight_update()
        with pytest.raises(EngineError, match="no weight-update session"):
            client.end_weight_update()
        for name, tensor in zip(PARAMS, new, strict=True):
            assert torch.equal(torch.tensor(client.get_weights_by_name(name)), tensor[:100])
        assert client.model_info()["weight_version"] == "7"
        assert client.generate([[1, 2]], {"max_new_tokens": 1})[0]["meta_info"]["weight_version"] == "7"

        # an unknown name fails the whole update: the known tensor is not applied either
        client.begin_weight_update()
        with pytest.raises(EngineError, match="model.no_such.weight"):
            _send(
                client,
                pool,
                group,
                ["model.no_such.weight", PARAMS[1]],
                [torch.zeros(3), torch.zeros(64)],
                group_name,
            )
        client.end_weight_update()
        assert torch.equal(torch.tensor(client.get_weights_by_name(PARAMS[1])), new[1])

        # SGLang's flattened_bucket: one uint8 broadcast, the tensors' bytes back to back
        flat_new = [torch.randn(64, 256), torch.randn(64)]
        client.begin_weight_update()
        shapes = [list(t.shape) for t in flat_new]
        posted = pool.submit(
            client.update_weights_from_distributed,
            PARAMS,
            ["float32"] * 2,
            shapes,
            group_name,
            True,
            "8",
            "flattened_bucket",
        )
        broadcast(group, pack(flat_new, torch.float32), src=0)
        timings = posted.result(timeout=60)
        with pytest.raises(EngineError, match="load_format"):  # refused before any receive
            client.update_weights_from_distributed(
                PARAMS, ["float32"] * 2, shapes, group_name, True, "9", "x"
            )
        client.end_weight_update()
        for name, tensor in zip(PARAMS, flat_new, strict=True):
            assert torch.equal(torch.tensor(client.get_weights_by_name(name)), tensor[:100])
        assert client.model_info()["weight_version"] == "8"
        assert client.generate([[1, 2]], {"max_new_tokens": 2})[0]["meta_info"]["weight_version"] == "8"
        # the engine's own phase times, from the reply's header (the body is SGLang's)
        assert set(timings) == {"time_receive_s", "time_load_s"} and min(timings.values()) >= 0

    client.destroy_weights_update_group(group_name)
    client.begin_weight_update()
    with pytest.raises(EngineError, match="group_name"):
        client.update_weights_from_distributed(PARAMS[1:], ["float32"], [[64]], group_name)
    client.end_weight_update()

    # the sync's session wrapper: probes once, and a sync that fails still closes the session
    link = EngineLink(client, rank_offset=1, tp_size=1, dtype=torch.float32)
    sender = BroadcastSender([link], f"{group_name}-2", timeout_s=60)
    sender.open("127.0.0.1", 0, "gloo")  # the port the OS picks, bound before the engine hears it
    for flatten in (True, False):  # one flat buffer, then one broadcast per tensor
        sender.flatten = flatten
        sent = [torch.randn(64, 256), torch.randn(64)]
        with sender.session():
            assert sender.send_bucket(PARAMS, sent, True, f"flat-{flatten}") == 4 * (64 * 256 + 64)
        for name, tensor in zip(PARAMS, sent, strict=True):
            assert torch.equal(torch.tensor(client.get_weights_by_name(name)), tensor[:100])
        assert client.model_info()["weight_version"] == f"flat-{flatten}"
    with pytest.raises(KeyError), sender.session():
        raise KeyError("a failed sync")
    assert link.has_session is True
    client.begin_weight_update()  # would fail had the session stayed open
    client.end_weight_update()
    # a session left open (a sync gave up before its late begin was answered) is closed and
    # opened again by the next sync, which goes through
    client.begin_weight_update()
    t0 = time.monotonic()
    with sender.session():
        sender.send_bucket(PARAMS, sent, True, "after-stale")
    assert time.monotonic() - t0 < 30  # not the group's 60 s timeout: the group stayed in step
    assert client.model_info()["weight_version"] == "after-stale"
    assert client.generate([[1, 2]], {"max_new_tokens": 1})[0]["output_ids"]  # resumed after the sync
    sender.close()


def test_session_off_speaks_the_older_protocol(model_dir):
    """`--weight-update-session off`: no session routes (404, as SGLang 0.5.16), updates go through."""
    port = free_port()
    cmd = [
        sys.executable,
        "-m",
        "infra.engine_server.server",
        "--model-path",
        str(model_dir),
        "--port",
        str(port),
    ]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.Popen([*cmd, "--weight-update-session", "off"], cwd=REPO, env=env)
    client = EngineClient(f"http://127.0.0.1:{port}", timeout_s=60)
    try:
        client.wait_healthy(180)
        with pytest.raises(EngineError) as refused:
            client.begin_weight_update()
        assert refused.value.status == 404
        with ThreadPoolExecutor(1) as pool:
            group = _join(client, "old-protocol", pool)
            norm = torch.randn(64)
            _send(client, pool, group, PARAMS[1:], [norm], "old-protocol", "3")
        assert torch.equal(torch.tensor(client.get_weights_by_name(PARAMS[1])), norm)
        assert client.model_info()["weight_version"] == "3"
        client.destroy_weights_update_group("old-protocol")
    finally:
        stop_engine(proc)


def test_update_weights_from_disk(client, tmp_path):
    other = build_tiny_model(tmp_path / "other", TinyModelConfig(seed=1))
    client.update_weights_from_disk(str(other), weight_version="disk-1")
    name = "model.layers.1.self_attn.q_proj.weight"
    expected = load_file(str(other / "model.safetensors"))[name]
    assert torch.equal(torch.tensor(client.get_weights_by_name(name)), expected[:100])
    assert client.model_info()["weight_version"] == "disk-1"
    with pytest.raises(EngineError, match="model_path"):
        client.update_weights_from_disk(str(tmp_path / "missing"))


def test_pause_continue_and_abort(client):
    with ThreadPoolExecutor(2) as pool:
        client.pause_generation(mode="in_place")
        waiting = pool.submit(client.generate, [[1, 3]], {"max_new_tokens": 2})
        time.sleep(0.5)
        assert not waiting.done()  # paused: new requests wait
        client.continue_generation()
        assert len(waiting.result(timeout=30)[0]["output_ids"]) == 2

        # long generations, aborted in flight by pause(abort)
        long = {"max_new_tokens": 20000, "ignore_eos": True}
        running = pool.submit(client.generate, [[1, 3], [1, 4]], long, ["long-1", "long-2"])
        time.sleep(0.5)
        while not running.done():  # repeat: the request may not have arrived yet
            client.pause_generation("abort")
            time.sleep(0.2)
        outs = running.result(timeout=30)
        assert all(o["meta_info"]["finish_reason"] == {"type": "abort"} for o in outs)
        assert all(len(o["output_ids"]) < 20000 for o in outs)
        client.continue_generation()


def test_rids_per_sample_and_abort_by_rid(client):
    """SGLang's rid rules: a string for a batch becomes `rid_i`; n>1 copies get fresh rids;
    a per-input list is kept, and /abort_request with one of them ends that sample only."""
    short = {"max_new_tokens": 1}
    assert [o["meta_info"]["id"] for o in client.generate([[1, 3], [1, 4]], short, "b")] == ["b_0", "b_1"]
    single = {"input_ids": [1, 3], "sampling_params": short, "rid": "one"}
    assert _post(client.url, "/generate", single).json()["meta_info"]["id"] == "one"  # a single input
    assert client.generate([[1, 3]], short, "one")[0]["meta_info"]["id"] == "one_0"  # a batch of one
    copies = client.generate([[1, 3]], {**short, "n": 2}, "grp")
    assert len({o["meta_info"]["id"] for o in copies}) == 2 and "grp" not in {
        o["meta_info"]["id"] for o in copies
    }
    with pytest.raises(EngineError, match="duplicate"):
        client.generate([[1, 3], [1, 4]], short, ["x", "x"])

    params = {"max_new_tokens": 600, "ignore_eos": True}
    with ThreadPoolExecutor(1) as pool:
        running = pool.submit(client.generate, [[1, 3], [1, 3], [1, 4]], params, ["s-0", "s-1", "s-2"])
        client.abort_request(rid="s")  # not an exact rid in flight: aborts nothing, as SGLang
        while not running.done():
            client.abort_request(rid="s-1")
            time.sleep(0.05)
        outs = running.result(timeout=60)
    assert [o["meta_info"]["id"] for o in outs] == ["s-0", "s-1", "s-2"]
    assert outs[1]["meta_info"]["finish_reason"] == {"type": "abort"} and len(outs[1]["output_ids"]) < 600
    for kept in (outs[0], outs[2]):
        assert kept["meta_info"]["finish_reason"] == {"type": "length", "length": 600}


def test_per_input_seeds(client):
    """A seed per input: each sample follows its own seed, whatever its batch."""
    params = {"max_new_tokens": 6, "temperature": 1.0}
    seeded = [{**params, "sampling_seed": s} for s in (5, 6)]
    pair = client.generate([[1, 3], [1, 3]], seeded)
    alone = client.generate([[1, 3]], [seeded[1]])
    assert pair[1]["output_ids"] == alone[0]["output_ids"]
    assert pair[0]["output_ids"] != pair[1]["output_ids"]
    with pytest.raises(EngineError, match="sampling_params"):
        client.generate([[1, 3], [1, 3]], [params, {**params, "temperature": 0.5}])


def test_model_info_and_server_info(client):
    info = client.model_info()
    assert info["weight_version"] and info["is_generation"] is True and info["model_path"]
    assert client.server_info()["dtype"] == "float32"
    assert httpx.get(f"{client.url}/get_weight_version", timeout=10).status_code == 404  # not an SGLang route


def test_bad_requests_name_the_field(server, client):
    url = server[0]
    resp = _post(url, "/init_weights_update_group", {"master_port": 1, "rank_offset": 1, "world_size": 2})
    assert resp.status_code == 400 and "master_address" in resp.json()["message"]
    resp = _post(url, "/generate", {"sampling_params": {"max_new_tokens": 1}})
    assert resp.status_code == 400 and "input_ids" in resp.json()["message"]
    resp = _post(url, "/generate", {"input_ids": [1], "sampling_params": {"min_p": 0.1}})
    assert resp.status_code == 400 and "min_p" in resp.json()["message"]
    with pytest.raises(EngineError, match="name"):
        client.get_weights_by_name("nope")
    # a CPU torch build has no NCCL: refused with the reason before any rendezvous
    with pytest.raises(EngineError, match="nccl"):
        client.init_weights_update_group("127.0.0.1", free_port(), 1, 2, "g", backend="nccl")
    assert httpx.get(f"{url}/health_generate", timeout=30).status_code == 200


def test_stop_engine_ends_the_process(model_dir):
    proc = launch_engine("torch", str(model_dir), "127.0.0.1", free_port(), seed=0, threads=1, extra_args={})
    stop_engine(proc, timeout_s=10)
    assert proc.poll() is not None and not alive(proc.pid)


def test_engine_dies_with_its_parent(model_dir):
    launcher = (
        "import sys, time\n"
        "from infra.engines.launch import launch_engine\n"
        f"p = launch_engine('torch', {str(model_dir)!r}, '127.0.0.1', {free_port()}, seed=0, threads=1)\n"
        "print(p.pid, flush=True)\n"
        "time.sleep(120)\n"
    )
    parent = subprocess.Popen([sys.executable, "-c", launcher], cwd=REPO, stdout=subprocess.PIPE, text=True)
    engine_pid = -1
    try:
        engine_pid = int(parent.stdout.readline())
        assert alive(engine_pid)
        parent.send_signal(signal.SIGKILL)
        parent.wait(timeout=10)
        deadline = time.monotonic() + 10
        while alive(engine_pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not alive(engine_pid)
    finally:
        parent.kill()
        if engine_pid > 0 and alive(engine_pid):
            os.kill(engine_pid, signal.SIGKILL)


def test_wait_until_healthy_fails_fast_with_log(tmp_path):
    log = str(tmp_path / "bad.log")
    proc = launch_engine(
        "torch", str(tmp_path / "missing"), "127.0.0.1", free_port(), seed=0, threads=1, log_path=log
    )
    started = time.monotonic()
    with pytest.raises(EngineError, match="exited"):
        wait_until_healthy("http://127.0.0.1:1", proc, 180)
    assert (
        time.monotonic() - started < 120
    )  # at the exit, long before the timeout (slow start-up on a busy machine)
