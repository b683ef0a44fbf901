"""The pipelined push (bucket i+1 gathered and announced while bucket i is on the wire)
against a real built-in engine server; this process plays trainer rank 0. Plain tensors
take gather_full's local path, so no trainer group is needed."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
import torch

from infra.config import TinyModelConfig
from infra.engines.client import EngineClient
from infra.engines.launch import launch_engine, stop_engine, wait_until_healthy
from infra.model.tiny import build_tiny_model
from infra.trainer.push import push_buckets
from infra.weights.broadcast import BroadcastSender, EarlierBucketFailed, pack
from infra.weights.engines import EngineLink
from tests.ports import free_port

TIMEOUT_S = 60  # the group's: a receive left waiting would show as a push this slow


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EngineClient]:
    torch.set_num_threads(1)
    model_dir = build_tiny_model(tmp_path_factory.mktemp("tiny"), TinyModelConfig())
    port = free_port()
    proc = launch_engine("torch", str(model_dir), "127.0.0.1", port, seed=0, threads=1)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_healthy(url, proc, 180)
        yield EngineClient(url, timeout_s=TIMEOUT_S)
    finally:
        stop_engine(proc)


@pytest.fixture
def sender(client: EngineClient, request: pytest.FixtureRequest) -> Iterator[BroadcastSender]:
    link = EngineLink(client, rank_offset=1, tp_size=1, dtype=torch.float32)
    sender = BroadcastSender([link], f"push-{request.node.name}", timeout_s=TIMEOUT_S)
    sender.open("127.0.0.1", 0, "gloo")  # the port the OS picks, bound before the engine hears it
    yield sender
    sender.close()


def _model_params(client: EngineClient) -> dict[str, torch.Tensor]:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(client.server_info()["model_path"], dtype=torch.float32)
    return {name: torch.randn_like(p) for name, p in model.named_parameters()}


def test_pipelined_push_sends_every_bucket_and_reuses_buffers(client, sender):
    params = _model_params(client)
    names = list(params)
    buckets = [names[:3], names[3:10], names[10:]]
    with sender.session():
        first = push_buckets(params, buckets, sender, "p1", keep=True)
    assert first.failed is None and len(first.sent) == len(first.payloads) == 3
    assert first.nbytes == sum(p.numel() * 4 for p in params.values())
    for name in (names[0], names[-1]):
        assert torch.equal(torch.tensor(client.get_weights_by_name(name)), params[name][:100])
    # a later push fills the old buffers again, in place
    params = {name: p + 1 for name, p in params.items()}
    with sender.session():
        second = push_buckets(params, buckets, sender, "p2", keep=False, reuse=first.payloads)
    assert second.failed is None
    assert [p[0].data_ptr() for p in second.payloads] == [p[0].data_ptr() for p in first.payloads]
    assert torch.equal(torch.tensor(client.get_weights_by_name(names[-1])), params[names[-1]][:100])
    assert client.model_info()["weight_version"] == "p2"


def test_a_bucket_refused_after_its_receive_stops_the_next_request(client, sender):
    """Bucket 2 is announced while bucket 1 is still on the wire. The engine refuses bucket 1
    after receiving it (an unknown name), so bucket 2's request is never sent: the engine is
    not left waiting in a receive, and the next sync goes through at once."""
    t0 = time.monotonic()
    with pytest.raises(RuntimeError, match="unknown parameter"), sender.session():
        bad = sender.announce(["no.such.weight"], [[64]], False, "bad")
        nxt = sender.announce(["model.norm.weight"], [[64]], True, "bad", after=bad)
        transfer = sender.start(bad, [pack([torch.randn(64)], torch.float32)])
        try:
            sender.finish(transfer)
        finally:
            with pytest.raises(EarlierBucketFailed):
                nxt.posts[0].result(timeout=TIMEOUT_S)
    norm = torch.randn(64)
    with sender.session():
        sender.send_bucket(["model.norm.weight"], [norm], True, "after")
    assert time.monotonic() - t0 < TIMEOUT_S / 2
    assert torch.equal(torch.tensor(client.get_weights_by_name("model.norm.weight")), norm)


def test_a_failed_middle_bucket_stops_the_push_and_keeps_the_engine_free(client, sender):
    params = _model_params(client)
    names = list(params)
    params["no.such.weight"] = torch.randn(8)
    buckets = [names[:3], ["no.such.weight"], names[3:10], names[10:]]
    t0 = time.monotonic()
    with pytest.raises(RuntimeError, match="unknown parameter"), sender.session():
        result = push_buckets(params, buckets, sender, "broken", keep=True)
        assert len(result.sent) == 1  # the first bucket only; nothing after the refused one
        raise result.failed
    # the failed sync resumed the generation it paused: a request is answered at once
    assert client.generate([[1, 20]], {"max_new_tokens": 1})[0]["output_ids"]
    with sender.session():
        assert push_buckets({n: params[n] for n in names}, [names], sender, "ok", keep=False).failed is None
    assert time.monotonic() - t0 < TIMEOUT_S / 2
    assert client.model_info()["weight_version"] == "ok"
