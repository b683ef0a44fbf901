"""Pure parts of the weight path: group layout, the engines' dtype, export clean-up, unique
group names, and the engine actor loading an export from local or S3 storage; and the
engines asked and released all at once (simulated engines that take a while to answer)."""

from __future__ import annotations

import asyncio
import os
import tempfile
import threading
import time

import fsspec
import pytest
import torch
from safetensors.torch import load_file

from bench.sim_engine import SimSpec, serve
from infra.config import RunConfig, TinyModelConfig
from infra.engines.actor import EngineActor
from infra.engines.client import EngineClient, EngineError
from infra.model.tiny import build_tiny_model
from infra.storage.fs import RunStore, storage_options
from infra.weights.broadcast import BroadcastSender
from infra.weights.engines import EngineLink, connect_engines, group_layout, resolve_dtype
from infra.weights.transport import export_rel, group_name_for, remove_older_exports
from tests.ports import free_port


def test_group_layout_counts_tp_ranks():
    assert group_layout([1, 1]) == ([1, 2], 3)
    assert group_layout([2]) == ([1], 3)  # one engine with tp 2: ranks 1 and 2
    assert group_layout([2, 1, 4]) == ([1, 3, 4], 8)
    with pytest.raises(ValueError, match="tp_size"):
        group_layout([0])


def test_engine_dtype_follows_sglang_auto_rule():
    assert resolve_dtype("bfloat16", {"dtype": "float32"}) == torch.bfloat16
    assert resolve_dtype("float32", {}) == torch.float32
    assert resolve_dtype("auto", {"torch_dtype": "bfloat16"}) == torch.bfloat16
    assert resolve_dtype(None, {"dtype": "float32", "model_type": "llama"}) == torch.float16
    assert resolve_dtype("auto", {"dtype": "float32", "model_type": "gemma2"}) == torch.bfloat16
    with pytest.raises(ValueError, match="dtype"):
        resolve_dtype("float7", {})


def test_group_names_are_unique_per_run():
    names = {group_name_for("demo") for _ in range(20)}
    assert len(names) == 20 and all(n.startswith("prl-demo-") for n in names)


def _cfg(uri: str) -> RunConfig:
    return RunConfig.model_validate({"run_name": "w", "storage": {"uri": uri}})


def test_older_exports_are_removed(storage_uri):
    store = RunStore(_cfg(storage_uri).storage, "w")
    for version in (1, 2, 3):
        store.write_text(f"{export_rel(version)}/config.json", "{}")
    store.write_text("weights/notes.txt", "not an export")
    assert remove_older_exports(store, keep=3) == 2
    assert store.ls("weights") == ["notes.txt", "v0000003"]
    assert remove_older_exports(store, keep=3) == 0  # a retried clean-up changes nothing


def test_engine_actor_loads_an_export_from_storage(storage_uri, tmp_path):
    """Disk sync on the engine side: a remote export is made local on the engine's node, loaded
    by /update_weights_from_disk, and the local copy removed."""
    cfg = _cfg(storage_uri)
    opts = storage_options(cfg.storage)
    base = build_tiny_model(tmp_path / "base", TinyModelConfig())
    other = build_tiny_model(tmp_path / "other", TinyModelConfig(seed=3))
    uri = RunStore(cfg.storage, "w").uri(export_rel(4))
    fs, path = fsspec.core.url_to_fs(uri, **opts)
    fs.makedirs(path, exist_ok=True)
    for name in sorted(os.listdir(other), key=lambda n: n == "config.json"):
        fs.put_file(str(other / name), f"{path}/{name}")

    actor = EngineActor(cfg, 0, local_cluster=True)
    actor.start(str(base), {})
    try:
        before = set(os.listdir(tempfile.gettempdir()))
        actor.load_weights_from_disk(uri, opts, "4")
        assert not {
            n for n in set(os.listdir(tempfile.gettempdir())) - before if n.startswith("prl-weights-")
        }
        from infra.engines.client import EngineClient

        client = EngineClient(actor.url)
        assert client.model_info()["weight_version"] == "4"
        name = "model.layers.0.self_attn.q_proj.weight"
        expected = load_file(str(other / "model.safetensors"))[name]
        assert torch.equal(torch.tensor(client.get_weights_by_name(name)), expected[:100])
    finally:
        actor.stop()


def test_engine_actor_serves_on_the_port_its_server_bound(tmp_path):
    """The server binds port 0 itself, so no port chosen beforehand can be taken in between;
    the actor's URL names the port the server's own process listens on."""
    import psutil

    base = build_tiny_model(tmp_path / "base", TinyModelConfig())
    actor = EngineActor(_cfg(str(tmp_path / "runs")), 0, local_cluster=True)
    try:
        url = actor.start(str(base), {})
        assert "--port 0" in " ".join(actor.proc.args)
        listening = {
            c.laddr.port
            for c in psutil.Process(actor.pid()).net_connections("tcp")
            if c.status == psutil.CONN_LISTEN
        }
        assert url == f"http://127.0.0.1:{listening.pop()}" and not listening
        from infra.engines.client import EngineClient

        assert EngineClient(url).health()
    finally:
        actor.stop()


def test_engine_actor_gives_up_on_other_start_failures(tmp_path):
    actor = EngineActor(_cfg(str(tmp_path / "runs")), 0, local_cluster=True)
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "config.json").write_text("{}")  # an HF directory that loads no model
    from infra.engines.client import EngineError

    with pytest.raises(EngineError, match="exited with code"):
        actor.start(str(tmp_path / "broken"), {})
    actor.stop()


ANSWER_S = 0.4  # each simulated engine's time to answer /server_info and the group routes


@pytest.fixture(scope="module")
def slow_engines() -> list[str]:
    loop = asyncio.new_event_loop()
    threading.Thread(target=loop.run_forever, daemon=True).start()
    yield asyncio.run_coroutine_threadsafe(serve(SimSpec(control_s=ANSWER_S), 16), loop).result(timeout=60)
    loop.call_soon_threadsafe(loop.stop)


def test_engines_are_asked_and_released_all_at_once(slow_engines):
    t0 = time.perf_counter()
    links = connect_engines(slow_engines, 1, {"dtype": "float32"}, timeout_s=30)
    asked = time.perf_counter() - t0
    assert [link.rank_offset for link in links] == list(range(1, 17))
    assert [link.url for link in links] == slow_engines and {link.dtype for link in links} == {torch.float32}
    sender = BroadcastSender(links, "fan-out", timeout_s=30)
    t0 = time.perf_counter()
    sender.close()
    released = time.perf_counter() - t0
    # one engine at a time would take 16 answers each
    assert asked < 4 * ANSWER_S and released < 4 * ANSWER_S, (asked, released)


def test_an_engine_that_does_not_answer_is_named(slow_engines):
    dead = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    with pytest.raises(EngineError, match=dead):
        connect_engines([*slow_engines[:2], dead], 1, {"dtype": "float32"}, timeout_s=30)
    links = connect_engines(slow_engines[:2], 1, {"dtype": "float32"}, timeout_s=30)
    links.append(EngineLink(EngineClient(dead, 30), 3, 1, torch.float32))
    with pytest.raises(RuntimeError, match=f"destroy_weights_update_group failed on .*{dead}"):
        BroadcastSender(links, "fan-out", timeout_s=30).close()
