"""The HF export of a trained FSDP2 model: `from_pretrained` loads it (locally and from S3)
with the trainer's logits, and an engine takes it through /update_weights_from_disk."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from infra.model.loading import localize
from infra.engines.client import EngineClient
from infra.engines.launch import launch_engine, stop_engine, wait_until_healthy
from infra.storage.fs import join
from tests.dist.test_fsdp_trainer import ADDR, _batch, _cfg, _spawn
from tests.ports import free_port

pytestmark = pytest.mark.dist
INPUT = torch.tensor([[5, 17, 42, 8, 99, 23], [7, 7, 60, 61, 62, 3]])


def _export_worker(rank: int, port: int, model_path: str, uri: str, out: str) -> None:
    from infra.trainer.rank import TrainerRank

    torch.set_num_threads(1)
    trainer = TrainerRank(_cfg(), rank, 2)
    trainer.setup(model_path, {}, ADDR, port)
    trainer.train(0, _batch(3))  # export trained weights, not the initial ones
    with torch.no_grad():
        logits = trainer.model(input_ids=INPUT).logits  # a collective under FSDP2: all ranks
    trainer.export_hf(uri, {})
    if rank == 0:
        torch.save(logits, out)
    trainer.shutdown()


def test_export_loads_with_the_trainers_logits(storage_uri, model_dir, tmp_path):
    uri = join(storage_uri, "hf", "latest")
    out = tmp_path / "trainer_logits.pt"
    _spawn(_export_worker, 2, free_port(), str(model_dir), uri, str(out))

    local = localize(uri, {})  # downloads from S3; a local export is used in place
    model = AutoModelForCausalLM.from_pretrained(local)
    with torch.no_grad():
        logits = model(input_ids=INPUT).logits
    assert torch.allclose(logits, torch.load(out), atol=1e-5, rtol=0)
    assert (Path(local) / "tokenizer.json").exists()


def test_engine_takes_the_export_from_disk(model_dir, tmp_path):
    export = tmp_path / "export"
    _spawn(_export_worker, 2, free_port(), str(model_dir), str(export), str(tmp_path / "l.pt"))
    port = free_port()
    proc = launch_engine("torch", str(model_dir), ADDR, port, seed=0, threads=1)
    try:
        url = f"http://{ADDR}:{port}"
        wait_until_healthy(url, proc, 60)
        client = EngineClient(url)
        client.update_weights_from_disk(str(export), weight_version="5")
        assert client.model_info()["weight_version"] == "5"
        for name, tensor in load_file(export / "model.safetensors").items():
            rows = client.get_weights_by_name(name, truncate_size=len(tensor))  # every row
            assert torch.equal(torch.tensor(rows), tensor), name
    finally:
        stop_engine(proc)
