"""The reverse direction: a trainer rank built by SGLang's own `init_custom_process_group`,
speaking SGLang's HTTP weight-update protocol, against our built-in engine server."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
import torch

from infra.config import TinyModelConfig
from infra.engines.client import EngineClient
from infra.engines.launch import launch_engine, stop_engine, wait_until_healthy
from infra.model.tiny import build_tiny_model
from infra.secrets import API_KEY_ENV
from tests.ports import free_port
from tests.sglang.conftest import run_json

pytestmark = pytest.mark.sglang
KEY = "trainer-side-test-key"


@pytest.fixture
def engine(tmp_path, monkeypatch) -> Iterator[EngineClient]:
    monkeypatch.setenv(API_KEY_ENV, KEY)  # the built-in server enforces the run's key
    model_dir = build_tiny_model(tmp_path / "model", TinyModelConfig())
    port = free_port()
    proc = launch_engine("torch", str(model_dir), "127.0.0.1", port, seed=0, threads=1)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_healthy(url, proc, 180)
        yield EngineClient(url, timeout_s=120)
    finally:
        stop_engine(proc)


def test_an_sglang_built_trainer_rank_updates_our_engine(engine: EngineClient, sglang_python: str):
    names = ["model.norm.weight", "lm_head.weight", "model.layers.0.self_attn.q_proj.weight"]
    shapes = [list(torch.tensor(engine.get_weights_by_name(n, 10**6)).shape) for n in names]
    spec = {
        "url": engine.url,
        "api_key": os.environ[API_KEY_ENV],
        "port": free_port(),
        "group_name": "sglang-trainer-side",
        "seed": 5,
        "version": "41",
        "tensors": [[n, s] for n, s in zip(names, shapes, strict=True)],
    }
    assert run_json(sglang_python, "trainer_rank.py", spec) == {"ok": True}
    gen = torch.Generator().manual_seed(5)
    for name, shape in zip(names, shapes, strict=True):
        sent = torch.randn(shape, generator=gen)
        got = torch.tensor(engine.get_weights_by_name(name, 10**6))
        assert got.view(torch.uint8).equal(sent.view(torch.uint8)), name
    assert engine.model_info()["weight_version"] == "41"
