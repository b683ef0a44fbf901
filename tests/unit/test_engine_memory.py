"""Colocated mode's engine side: /release_memory_occupation frees the weights of a real
server process, requests that need them fail clearly, /resume_memory_occupation restores
them bit for bit. (CUDA's path, host copies and an emptied CUDA cache, needs a GPU.)"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import psutil
import pytest
import torch
from safetensors.torch import load_file

from infra.config import TinyModelConfig
from infra.engine_server.memory import WeightOffload
from infra.engine_server.sampling import sample_batch
from infra.engines.client import EngineClient
from infra.engines.launch import launch_engine, stop_engine, wait_until_healthy
from infra.model.tiny import build_tiny_model
from tests.ports import free_port

# ~4.7M parameters (19 MB in fp32): large enough that freeing them shows in the RSS
SHAPE = TinyModelConfig(hidden_size=256, num_layers=4, num_heads=4, intermediate_size=1024)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("tiny"), SHAPE)


@pytest.fixture(scope="module")
def server(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, int]]:
    port = free_port()
    log = str(tmp_path_factory.mktemp("log") / "engine.log")
    proc = launch_engine("torch", str(model_dir), "127.0.0.1", port, seed=0, threads=1, log_path=log)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_healthy(url, proc, 60)
        yield url, proc.pid
    finally:
        stop_engine(proc)


def _rss(pid: int) -> int:
    return psutil.Process(pid).memory_info().rss


def test_release_frees_weights_and_resume_restores_them(server, model_dir):
    url, pid = server
    client = EngineClient(url, timeout_s=60)
    greedy = {"max_new_tokens": 6, "temperature": 0}
    (before,) = client.generate([[1, 5, 6]], greedy)
    name = "model.layers.1.mlp.up_proj.weight"
    weights = load_file(str(model_dir / "model.safetensors"))
    weight_bytes = sum(t.numel() * t.element_size() for t in weights.values())

    rss_resident = _rss(pid)
    client.release_memory_occupation()
    rss_released = _rss(pid)
    # most of the weights' bytes left the process (the allocator may keep some pages)
    assert rss_resident - rss_released > 0.6 * weight_bytes, (rss_resident, rss_released, weight_bytes)
    client.release_memory_occupation(["weights"])  # a second release is a no-op, not an error

    refused = httpx.post(
        f"{url}/generate", json={"input_ids": [1, 5], "sampling_params": {"max_new_tokens": 4}}, timeout=30
    )
    assert refused.status_code == 400
    assert "/resume_memory_occupation" in refused.json()["message"]
    check = httpx.post(f"{url}/get_weights_by_name", json={"name": name}, timeout=30)
    assert check.status_code == 400 and "released" in check.json()["message"]
    disk = httpx.post(f"{url}/update_weights_from_disk", json={"model_path": str(model_dir)}, timeout=30)
    assert disk.status_code == 400 and "released" in disk.json()["message"]
    assert httpx.get(f"{url}/health", timeout=30).status_code == 200  # alive, just not resident

    client.resume_memory_occupation(["kv_cache"])  # not the weights: still released
    still = httpx.post(
        f"{url}/generate", json={"input_ids": [1], "sampling_params": {"max_new_tokens": 4}}, timeout=30
    )
    assert still.status_code == 400 and "/resume_memory_occupation" in still.json()["message"]
    client.resume_memory_occupation()
    # same greedy tokens and bitwise the same logprobs: every weight came back as it was
    (after,) = client.generate([[1, 5, 6]], greedy)
    assert after["output_ids"] == before["output_ids"]
    assert after["meta_info"]["output_token_logprobs"] == before["meta_info"]["output_token_logprobs"]


def test_unknown_tag_names_the_field(server):
    bad = httpx.post(f"{server[0]}/release_memory_occupation", json={"tags": ["everything"]}, timeout=30)
    assert bad.status_code == 400 and "tags" in bad.json()["message"]


def test_offload_keeps_tied_weights_tied(model_dir):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model.lm_head.weight = model.model.embed_tokens.weight  # tie them, as many small models do
    expected = {k: v.clone() for k, v in model.state_dict().items()}
    offload = WeightOffload(model)
    assert offload.release() > 0 and offload.released
    assert all(p.numel() == 0 for p in model.parameters())
    offload.resume()
    assert model.lm_head.weight is model.model.embed_tokens.weight
    assert all(torch.equal(v, expected[k]) for k, v in model.state_dict().items())


def test_resumed_weights_sample_the_same_logprobs_bitwise(model_dir):
    """The engine's own sampling path (fused matmuls) after a release and resume: bitwise the
    same logprobs. Restoring the tensors safetensors loaded, at its buffer's addresses, gave
    logprobs 1 ulp off on every resume (CPU kernels round by operand alignment)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the engine runs
    try:
        (before,) = sample_batch(model, [[1, 5, 6]], max_new_tokens=6, temperature=0)
        offload = WeightOffload(model)
        for _ in range(3):
            offload.release()
            offload.resume()
            (after,) = sample_batch(model, [[1, 5, 6]], max_new_tokens=6, temperature=0)
            assert after.output_ids == before.output_ids
            assert after.logprobs == before.logprobs
    finally:
        torch.set_num_threads(threads)
