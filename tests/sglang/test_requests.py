"""Every request our EngineClient sends is accepted by SGLang's own FastAPI app, and the request
object SGLang parses from it carries our values. The client's real HTTP requests are recorded
here (a small HTTP server on loopback), then replayed into the app in .venv-sglang."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from infra.engines.client import EngineClient
from tests.sglang.conftest import run_json

pytestmark = pytest.mark.sglang

# what a real engine answers, so the client's calls complete (only the requests matter here)
_ANSWERS = {
    "/generate": [{"text": "", "output_ids": [], "meta_info": {}}],
    "/get_weights_by_name": [0.0],
    "/model_info": {"weight_version": "0"},
}


class _Recorder(BaseHTTPRequestHandler):
    recorded: list[dict] = []

    def _handle(self) -> None:
        length = int(self.headers.get("content-length") or 0)
        body = self.rfile.read(length).decode() if length else None
        keep = ("content-type",)
        headers = {k.lower(): v for k, v in self.headers.items() if k.lower() in keep}
        self.recorded.append({"method": self.command, "path": self.path, "headers": headers, "body": body})
        out = json.dumps(_ANSWERS.get(self.path.split("?")[0], {"success": True})).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)

    do_GET = do_POST = _handle

    def log_message(self, *args) -> None:
        pass


@pytest.fixture(scope="module")
def recorded() -> Iterator[list[dict]]:
    """The HTTP requests of one call of every EngineClient method, in order."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Recorder)
    _Recorder.recorded = []
    threading.Thread(target=server.serve_forever, daemon=True).start()
    client = EngineClient(f"http://127.0.0.1:{server.server_address[1]}", timeout_s=30)
    try:
        # per-sample rids: SGLang keeps a rid list only as one rid per input (with n > 1 it
        # replaces them by fresh ones), so a group of n samples is sent as n copies, n=1
        client.generate(
            [[1, 5, 6], [1, 5, 6], [1, 7], [1, 7]],
            {"max_new_tokens": 8, "temperature": 1.0, "top_p": 0.9, "n": 1, "stop_token_ids": [2]},
            rid=["r-0", "r-1", "r-2", "r-3"],
        )
        # the shape SGLang refuses: a rid per sample with n > 1
        client_refused = EngineClient(client.url, timeout_s=30)
        client_refused.generate([[1, 5, 6]], {"max_new_tokens": 8, "n": 2}, rid=["r-a", "r-b"])
        client.init_weights_update_group("10.0.0.1", 29500, 1, 3, "wu-1", backend="nccl")
        client.begin_weight_update()
        client.update_weights_from_distributed(
            ["a.weight", "b.bias"],
            ["bfloat16", "float32"],
            [[4, 2], [2]],
            "wu-1",
            True,
            "8",
            "flattened_bucket",
        )
        client.end_weight_update()
        client.update_weights_from_disk("/ckpt/hf/latest", weight_version="9")
        client.get_weights_by_name("a.weight", truncate_size=3)
        client.get_weights_by_name("a.weight")
        client.pause_generation(mode="abort")
        client.continue_generation()
        client.flush_cache()
        client.abort_request(rid="r-1")
        client.abort_request(abort_all=True)
        client.destroy_weights_update_group("wu-1")
        client.release_memory_occupation()
        client.resume_memory_occupation()
        client.model_info()
        client.load_lora_adapter("v3", "/runs/r/lora/v3")
        client.generate([[1, 5], [1, 6]], {"max_new_tokens": 4}, rid=["l-0", "l-1"], lora_path="v3")
        client.generate([[1, 5], [1, 6]], {"max_new_tokens": 4}, rid=["m-0", "m-1"], lora_path=["v3", None])
        client.unload_lora_adapter("v2")
        yield list(_Recorder.recorded)
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture(scope="module")
def replayed(sglang_python: str, recorded: list[dict]) -> list[dict]:
    results = run_json(sglang_python, "replay_requests.py", recorded)
    return [dict(req, **res) for req, res in zip(recorded, results, strict=True)]


def _one(replayed: list[dict], path: str, index: int = 0) -> tuple[dict, dict]:
    matches = [r for r in replayed if r["path"].split("?")[0] == path]
    assert matches, f"the client sent no {path}"
    hit = matches[index]
    assert hit["status"] == 200, f"{path}: HTTP {hit['status']}: {hit['body']}"
    assert len(hit["calls"]) == 1, f"{path}: reached the tokenizer manager {len(hit['calls'])} times"
    return hit, hit["calls"][0][1]


def test_every_request_is_accepted(replayed):
    refused = [(r["path"], r["status"], r["body"]) for r in replayed if r["status"] != 200]
    assert refused == [("/generate", 400, replayed[1]["body"])]  # only the one meant to be refused
    assert "rids length mismatch" in str(replayed[1]["body"])


def test_generate_batch_with_per_sample_rids(replayed):
    _, obj = _one(replayed, "/generate")
    assert obj["input_ids"] == [[1, 5, 6], [1, 5, 6], [1, 7], [1, 7]]
    assert obj["rid"] == ["r-0", "r-1", "r-2", "r-3"]  # kept as sent: abort by rid can find them
    assert obj["return_logprob"] in (True, [True] * 4)
    params = obj["sampling_params"]
    params = params[0] if isinstance(params, list) else params
    assert params["max_new_tokens"] == 8 and params["n"] == 1 and params["stop_token_ids"] == [2]


def test_weight_update_group_and_session(replayed):
    _, init = _one(replayed, "/init_weights_update_group")
    assert (init["master_address"], init["master_port"], init["rank_offset"], init["world_size"]) == (
        "10.0.0.1",
        29500,
        1,
        3,
    )
    assert (init["group_name"], init["backend"]) == ("wu-1", "nccl")
    _one(replayed, "/begin_weight_update")
    _, upd = _one(replayed, "/update_weights_from_distributed")
    assert upd["names"] == ["a.weight", "b.bias"] and upd["dtypes"] == ["bfloat16", "float32"]
    assert upd["shapes"] == [[4, 2], [2]] and upd["group_name"] == "wu-1"
    assert upd["flush_cache"] is True and upd["weight_version"] == "8"
    assert upd["load_format"] == "flattened_bucket"  # one broadcast for the whole bucket
    _one(replayed, "/end_weight_update")
    _, destroy = _one(replayed, "/destroy_weights_update_group")
    assert destroy["group_name"] == "wu-1"


def test_update_from_disk(replayed):
    _, obj = _one(replayed, "/update_weights_from_disk")
    assert obj["model_path"] == "/ckpt/hf/latest" and obj["weight_version"] == "9"


@pytest.mark.parametrize("index,size", [(0, 3), (1, None)], ids=["truncated", "default"])
def test_get_weights_by_name_sends_an_int_truncate_size(replayed, index, size):
    # SGLang's truncate_size is an int (default 100), not nullable
    _, obj = _one(replayed, "/get_weights_by_name", index)
    assert obj["name"] == "a.weight" and isinstance(obj["truncate_size"], int)
    if size is not None:
        assert obj["truncate_size"] == size


def test_pause_continue_flush_abort(replayed):
    _, pause = _one(replayed, "/pause_generation")
    assert pause["mode"] == "abort"
    _one(replayed, "/continue_generation")
    _one(replayed, "/flush_cache")
    _, by_rid = _one(replayed, "/abort_request", 0)
    assert by_rid == {"rid": "r-1", "abort_all": False}
    _, everything = _one(replayed, "/abort_request", 1)
    assert everything["abort_all"] is True


def test_memory_occupation_and_model_info(replayed):
    _one(replayed, "/release_memory_occupation")
    _one(replayed, "/resume_memory_occupation")
    info = [r for r in replayed if r["path"] == "/model_info"]
    assert len(info) == 1 and info[0]["status"] == 200 and info[0]["body"]["weight_version"] == "7"


def test_lora_adapter_load_unload_and_generate_naming_them(replayed):
    _, load = _one(replayed, "/load_lora_adapter")
    assert (load["lora_name"], load["lora_path"], load["pinned"]) == ("v3", "/runs/r/lora/v3", False)
    _, unload = _one(replayed, "/unload_lora_adapter")
    assert unload["lora_name"] == "v2"
    _, base = _one(replayed, "/generate", 0)
    assert base["lora_path"] is None  # no field sent: the base weights
    _, every = _one(replayed, "/generate", 2)
    assert every["lora_path"] == ["v3", "v3"] and every["rid"] == ["l-0", "l-1"]
    _, mixed = _one(replayed, "/generate", 3)
    assert mixed["lora_path"] == ["v3", None]
