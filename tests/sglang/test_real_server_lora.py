"""LoRA adapters on SGLang's real server on CPU (launched as adapter sync launches it: LoRA
enabled, the torch-native LoRA backend, 2 adapters per batch), through EngineClient: what
tests/unit/test_server_lora.py holds for the built-in engine holds here too.

Samples of an adapter carry transformers + peft's logprobs, and samples without one the
base model's; one request mixes adapters and the base model; a duplicate name and a name
never loaded are refused with 400; an unloaded name is loaded again from its directory by
the next request naming it, and refused with 400 once the directory is gone; an adapter
whose directory is removed after its load serves on (what the engine actor relies on); an
unload answers once the generation using the adapter has ended.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from infra.engines.client import EngineClient, EngineError
from tests.lora import (
    ALL_TARGETS,
    Reference,
    assert_unload_waits,
    make_adapter,
    max_diff_of_replies,
)
from tests.sglang.servers import RealServer, assert_no_kernel_calls, long_context_model, real_sglang_server

pytestmark = [pytest.mark.sglang, pytest.mark.sglang_server]

PROMPTS = [[1, 5, 6, 7], [1, 20], [1, 30, 31]]
SAMPLING = {"max_new_tokens": 10, "temperature": 1.0, "ignore_eos": True}
TOLERANCE = 1e-4
RANK = 4


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return long_context_model(tmp_path_factory.mktemp("long-model"))


@pytest.fixture(scope="module")
def adapters(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("adapters")
    return {
        name: make_adapter(model_dir, root / name, seed=seed, r=RANK) for name, seed in [("a1", 1), ("a2", 2)]
    }


@pytest.fixture(scope="module")
def server(sglang_python: str, model_dir, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealServer]:
    torch.set_num_threads(1)
    logs = tmp_path_factory.mktemp("logs")
    with real_sglang_server(
        sglang_python, model_dir, logs, "lora-key", lora_rank=RANK, lora_targets=tuple(ALL_TARGETS)
    ) as srv:
        yield srv
    assert_no_kernel_calls()


@pytest.fixture(scope="module")
def client(server: RealServer, adapters) -> EngineClient:
    client = server.client()
    for name, path in adapters.items():
        assert client.load_lora_adapter(name, str(path))[name] == str(path)
    return client


def test_samples_of_an_adapter_carry_peft_s_logprobs_and_without_one_the_base_model_s(
    client, model_dir, adapters
):
    outs = client.generate(PROMPTS, SAMPLING, lora_path="a1")
    adapted = max_diff_of_replies(Reference(model_dir, adapters["a1"]), PROMPTS, outs)
    base = max_diff_of_replies(Reference(model_dir), PROMPTS, client.generate(PROMPTS, SAMPLING))
    print(f"SGLang: max |engine - peft| logprob {adapted:.2e}, base {base:.2e}")
    assert adapted < TOLERANCE and base < TOLERANCE
    assert max_diff_of_replies(Reference(model_dir), PROMPTS, outs) > 100 * TOLERANCE  # the adapter acted


def test_one_request_mixes_adapters_and_the_base_model(client, model_dir, adapters):
    names = ["a1", "a2", None]
    outs = client.generate(PROMPTS, SAMPLING, lora_path=names)
    for prompt, out, name in zip(PROMPTS, outs, names, strict=True):
        reference = Reference(model_dir, adapters[name] if name else None)
        assert max_diff_of_replies(reference, [prompt], [out]) < TOLERANCE, name


def test_a_duplicate_name_and_an_unknown_name_are_refused(client, adapters):
    with pytest.raises(EngineError, match="already loaded") as dup:
        client.load_lora_adapter("a1", str(adapters["a2"]))
    assert dup.value.status == 400
    with pytest.raises(EngineError, match="never been loaded: nope") as unknown:
        client.generate(PROMPTS, SAMPLING, lora_path="nope")
    assert unknown.value.status == 400


def test_an_adapter_serves_without_its_directory_and_an_unloaded_one_comes_back_only_from_it(
    client, model_dir, adapters, tmp_path
):
    path = shutil.copytree(adapters["a1"], tmp_path / "v7")
    client.load_lora_adapter("v7", str(path))
    shutil.rmtree(path)  # what the engine actor does once the adapter is loaded
    outs = client.generate(PROMPTS[:1], SAMPLING, lora_path="v7")
    assert max_diff_of_replies(Reference(model_dir, adapters["a1"]), PROMPTS[:1], outs) < TOLERANCE
    assert "v7" not in client.unload_lora_adapter("v7")
    with pytest.raises(EngineError, match="Failed to implicitly load LoRA adapter v7") as gone:
        client.generate(PROMPTS[:1], SAMPLING, lora_path="v7")
    assert gone.value.status == 400
    shutil.copytree(adapters["a2"], path)  # the directory back (another adapter's weights)
    outs = client.generate(PROMPTS[:1], SAMPLING, lora_path="v7")  # SGLang loads it again
    assert max_diff_of_replies(Reference(model_dir, adapters["a2"]), PROMPTS[:1], outs) < TOLERANCE
    client.unload_lora_adapter("v7")


def test_an_unload_waits_for_the_generation_using_the_adapter(client, adapters, tmp_path):
    client.load_lora_adapter("v8", str(shutil.copytree(adapters["a2"], tmp_path / "v8")))
    assert_unload_waits(client, "v8", inputs=16, tokens=900, hold_s=2.0, reply_s=1.0)
