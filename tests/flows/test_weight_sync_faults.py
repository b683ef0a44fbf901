"""A weight sync never hangs on a dead or frozen engine: it fails within
`weight_sync.timeout_s`, naming the engine's URL. Real engine server processes; this test
process plays trainer rank 0 of the weight-update group."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest
import torch

from infra.config import TinyModelConfig
from infra.engines.launch import launch_engine, stop_engine, wait_until_healthy
from infra.model.tiny import build_tiny_model
from infra.weights.broadcast import BroadcastSender
from infra.weights.engines import connect_engines
from tests.ports import free_port

pytestmark = pytest.mark.flow
TIMEOUT_S = 8


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("tiny"), TinyModelConfig())


@pytest.fixture
def engine(model_dir: Path):
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


def open_sender(model_dir: Path, url: str) -> BroadcastSender:
    config = json.loads((model_dir / "config.json").read_text())
    sender = BroadcastSender(connect_engines([url], 1, config, TIMEOUT_S), "sync-fault-test", TIMEOUT_S)
    sender.open("127.0.0.1", free_port(), "gloo")
    return sender


def one_bucket(model_dir: Path) -> tuple[list[str], list[torch.Tensor]]:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    params = dict(model.named_parameters())
    return list(params), [p.detach() for p in params.values()]


@pytest.mark.parametrize("fault", ["SIGKILL", "SIGSTOP"])
def test_sync_to_a_dead_or_frozen_engine_fails_in_time_naming_it(model_dir, engine, fault):
    url, proc = engine
    sender = open_sender(model_dir, url)
    names, tensors = one_bucket(model_dir)
    with sender.session():
        sender.send_bucket(names, tensors, True, "1")  # a healthy sync first

    t0 = time.monotonic()
    # the engine fails inside the session, before the broadcast
    with pytest.raises(RuntimeError) as err, sender.session():
        os.kill(proc.pid, getattr(signal, fault))
        t0 = time.monotonic()
        sender.send_bucket(names, tensors, True, "2")
    took = time.monotonic() - t0
    print(f"{fault}: sync failed after {took:.1f}s: {str(err.value)[:200]}")
    assert url in str(err.value)
    # the session's HTTP call, the post and the broadcast are each bounded by TIMEOUT_S
    assert took < 3 * TIMEOUT_S + 10
    with pytest.raises(RuntimeError, match=url):  # its end of the group went with the engine
        sender.close()  # and the sender's own end, and its connections to the engines


def test_forming_a_group_with_a_dead_engine_fails_in_time_naming_it(model_dir, engine):
    url, proc = engine
    config = json.loads((model_dir / "config.json").read_text())
    links = connect_engines([url], 1, config, TIMEOUT_S)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    sender = BroadcastSender(links, "sync-fault-test-2", TIMEOUT_S)
    t0 = time.monotonic()
    with pytest.raises(RuntimeError) as err:
        sender.open("127.0.0.1", free_port(), "gloo")
    took = time.monotonic() - t0
    print(f"group with a dead engine failed after {took:.1f}s")
    assert url in str(err.value)
    assert took < TIMEOUT_S + 10
