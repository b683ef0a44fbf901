"""The built-in server's replies (a real `python -m infra.engine_server.server` on a tiny model) parse
with SGLang's own response types, and /generate answers carry the fields SGLang's tokenizer
manager puts in its replies."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
import torch

from infra.config import TinyModelConfig
from infra.engines.launch import launch_engine, stop_engine, wait_until_healthy
from infra.model.tiny import build_tiny_model
from infra.weights.group import broadcast, close_update_group, open_update_group
from tests.lora import make_adapter
from tests.ports import free_port
from tests.sglang.conftest import run_json

pytestmark = pytest.mark.sglang

PARAM = "model.norm.weight"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    model_dir = build_tiny_model(tmp_path_factory.mktemp("tiny"), TinyModelConfig())
    port = free_port()
    log = str(tmp_path_factory.mktemp("log") / "engine.log")
    proc: subprocess.Popen = launch_engine(
        "torch", str(model_dir), "127.0.0.1", port, seed=0, threads=1, extra_args={}, log_path=log
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_healthy(url, proc, 60)
        yield url, model_dir
    finally:
        stop_engine(proc)


def _post(url: str, path: str, body: dict) -> dict | list:
    resp = httpx.post(f"{url}{path}", json=body, timeout=60)
    assert resp.status_code == 200, f"{path}: HTTP {resp.status_code}: {resp.text}"
    return resp.json()


def test_replies_parse_with_sglang_types(sglang_python: str, server, tmp_path):
    url, model_dir = server
    outputs: list[tuple[str, object]] = []
    port, group_name = free_port(), "conformance-replies"
    with ThreadPoolExecutor(1) as pool:
        joined = pool.submit(
            _post,
            url,
            "/init_weights_update_group",
            {
                "master_address": "127.0.0.1",
                "master_port": port,
                "rank_offset": 1,
                "world_size": 2,
                "group_name": group_name,
                "backend": "gloo",
            },
        )
        group = open_update_group(
            "127.0.0.1", port, rank=0, world_size=2, group_name=group_name, timeout_s=60
        )
        outputs.append(("InitWeightsUpdateGroupReqOutput", joined.result(timeout=60)))
        # the server speaks SGLang 0.5.23's protocol: updates only inside a session
        outputs.append(("BeginWeightUpdateReqOutput", _post(url, "/begin_weight_update", {})))
        new = torch.randn(64)
        body = {"names": [PARAM], "dtypes": ["float32"], "shapes": [[64]], "group_name": group_name}
        posted = pool.submit(_post, url, "/update_weights_from_distributed", {**body, "weight_version": "3"})
        broadcast(group, new, src=0)
        outputs.append(("UpdateWeightsFromDistributedReqOutput", posted.result(timeout=60)))
        outputs.append(("EndWeightUpdateReqOutput", _post(url, "/end_weight_update", {})))
        close_update_group(group)
    destroyed = _post(url, "/destroy_weights_update_group", {"group_name": group_name})
    outputs.append(("DestroyWeightsUpdateGroupReqOutput", destroyed))
    disk = _post(url, "/update_weights_from_disk", {"model_path": str(model_dir), "weight_version": "4"})
    outputs.append(("UpdateWeightFromDiskReqOutput", disk))
    weights = _post(url, "/get_weights_by_name", {"name": PARAM, "truncate_size": 100})
    outputs.append(("GetWeightsByNameReqOutput", weights))
    adapter = str(make_adapter(model_dir, tmp_path / "adapter", seed=1))
    outputs.append(
        ("LoRAUpdateOutput", _post(url, "/load_lora_adapter", {"lora_name": "v1", "lora_path": adapter}))
    )
    duplicate = httpx.post(
        f"{url}/load_lora_adapter", json={"lora_name": "v1", "lora_path": adapter}, timeout=60
    )
    assert duplicate.status_code == 400
    outputs.append(("LoRAUpdateOutput", duplicate.json()))
    outputs.append(("LoRAUpdateOutput", _post(url, "/unload_lora_adapter", {"lora_name": "v1"})))

    gen = _post(
        url,
        "/generate",
        {"input_ids": [[1, 5], [1, 6]], "sampling_params": {"max_new_tokens": 3}, "return_logprob": True},
    )
    greedy = {"max_new_tokens": 6, "temperature": 0}
    first = _post(url, "/generate", {"input_ids": [1, 9], "sampling_params": greedy})["output_ids"][0]
    stopped = _post(
        url, "/generate", {"input_ids": [1, 9], "sampling_params": {**greedy, "stop_token_ids": [first]}}
    )
    reasons = [o["meta_info"]["finish_reason"] for o in [*gen, stopped]]

    parsed = run_json(sglang_python, "parse_replies.py", {"outputs": outputs, "finish_reasons": reasons})
    assert parsed["outputs"] == [None] * len(outputs), parsed["outputs"]
    assert parsed["finish_reasons"] == reasons  # as SGLang's FINISH_LENGTH / FINISH_MATCHED_TOKEN write them
    assert [r["type"] for r in reasons] == ["length", "length", "stop"]

    for out in gen:  # the fields SGLang's tokenizer manager puts in a /generate reply
        assert isinstance(out["text"], str) and all(isinstance(t, int) for t in out["output_ids"])
        meta = out["meta_info"]
        assert {"finish_reason", "prompt_tokens", "completion_tokens", "weight_version"} <= set(meta)
        assert meta["weight_version"] == "4" and meta["completion_tokens"] == len(out["output_ids"])
        triples = meta["output_token_logprobs"]
        assert [len(t) for t in triples] == [3] * len(out["output_ids"])
        assert all(
            isinstance(lp, float) and tok == oid
            for (lp, tok, _), oid in zip(triples, out["output_ids"], strict=True)
        )
