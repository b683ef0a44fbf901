"""The engine actor's adapter sync: a PEFT adapter directory in the run's storage (local or
S3) is copied to the engine's node, loaded under a name, and the copy removed; once
unloaded, the name is refused."""

from __future__ import annotations

import os
import tempfile

import fsspec
import pytest
import torch

from infra.config import RunConfig, TinyModelConfig
from infra.engines.actor import EngineActor
from infra.engines.client import EngineClient, EngineError
from infra.model.tiny import build_tiny_model
from infra.storage.fs import RunStore, storage_options
from tests.lora import Reference, make_adapter, max_diff

PROMPT = [1, 5, 6]


def test_engine_actor_loads_an_adapter_from_storage_and_unloads_it(storage_uri, tmp_path):
    torch.set_num_threads(1)
    cfg = RunConfig.model_validate({"run_name": "w", "storage": {"uri": storage_uri}})
    opts = storage_options(cfg.storage)
    base = build_tiny_model(tmp_path / "base", TinyModelConfig())
    adapter = make_adapter(base, tmp_path / "adapter", seed=1)
    uri = RunStore(cfg.storage, "w").uri("adapters/v4")
    fs, path = fsspec.core.url_to_fs(uri, **opts)
    fs.makedirs(path, exist_ok=True)
    for name in os.listdir(adapter):
        fs.put_file(str(adapter / name), f"{path}/{name}")

    actor = EngineActor(cfg, 0, local_cluster=True)
    actor.start(str(base), {})
    try:
        before = set(os.listdir(tempfile.gettempdir()))
        actor.load_lora_from_disk(uri, opts, "v4")
        assert not {n for n in set(os.listdir(tempfile.gettempdir())) - before if n.startswith("prl-lora-")}
        client = EngineClient(actor.url)
        (out,) = client.generate([PROMPT], {"max_new_tokens": 6, "ignore_eos": True}, lora_path="v4")
        logprobs = [lp for lp, _, _ in out["meta_info"]["output_token_logprobs"]]
        assert max_diff(Reference(base, adapter), PROMPT, out["output_ids"], logprobs) < 1e-4
        actor.unload_lora("v4")
        with pytest.raises(EngineError, match="lora_path") as refused:
            client.generate([PROMPT], {"max_new_tokens": 2}, lora_path="v4")
        assert refused.value.status == 400
        with pytest.raises(FileNotFoundError, match="no PEFT adapter directory"):
            actor.load_lora_from_disk(RunStore(cfg.storage, "w").uri("adapters/v5"), opts, "v5")
    finally:
        actor.stop()
