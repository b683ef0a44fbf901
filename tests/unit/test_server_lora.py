"""LoRA adapters on the built-in engine server (a real process) through EngineClient, with
SGLang 0.5.23's semantics (tests/sglang/test_real_server_lora.py holds the same against
SGLang's server): a loaded adapter's samples carry peft's logprobs; a duplicate name, an
unknown name and a name whose directory is gone after its unload are refused with 400; an
unload waits for the generation using the adapter; one request may mix adapters."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from infra.config import TinyModelConfig
from infra.engines.client import EngineClient, EngineError
from infra.model.tiny import build_tiny_model
from tests.engine_server import running_engine
from tests.lora import Reference, assert_unload_waits, make_adapter, max_diff_of_replies

PROMPTS = [[1, 5, 6, 7], [1, 20], [1, 30, 31]]
SAMPLING = {"max_new_tokens": 10, "temperature": 1.0, "ignore_eos": True}
TOLERANCE = 1e-4


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    torch.set_num_threads(1)
    # room for the long generation an unload waits for
    return build_tiny_model(tmp_path_factory.mktemp("tiny"), TinyModelConfig(max_position_embeddings=2048))


@pytest.fixture(scope="module")
def adapters(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("adapters")
    return {name: make_adapter(model_dir, root / name, seed=seed) for name, seed in [("a1", 1), ("a2", 2)]}


@pytest.fixture(scope="module")
def client(model_dir: Path, adapters) -> Iterator[EngineClient]:
    with running_engine(str(model_dir)) as url:
        client = EngineClient(url, timeout_s=120)
        for name, path in adapters.items():
            assert client.load_lora_adapter(name, str(path))[name] == str(path)
        yield client


def test_samples_of_an_adapter_carry_peft_s_logprobs_and_without_one_the_base_model_s(
    client, model_dir, adapters
):
    adapted = max_diff_of_replies(
        Reference(model_dir, adapters["a1"]), PROMPTS, client.generate(PROMPTS, SAMPLING, lora_path="a1")
    )
    base = max_diff_of_replies(Reference(model_dir), PROMPTS, client.generate(PROMPTS, SAMPLING))
    print(f"built-in engine: max |engine - peft| logprob {adapted:.2e}, base {base:.2e}")
    assert adapted < TOLERANCE and base < TOLERANCE


def test_one_request_mixes_adapters_and_the_base_model(client, model_dir, adapters):
    names = ["a1", "a2", None]
    outs = client.generate(PROMPTS, SAMPLING, lora_path=names)
    for prompt, out, name in zip(PROMPTS, outs, names, strict=True):
        reference = Reference(model_dir, adapters[name] if name else None)
        assert max_diff_of_replies(reference, [prompt], [out]) < TOLERANCE, name
    # n copies of an input run with the input's adapter
    outs = client.generate(PROMPTS[:2], {**SAMPLING, "n": 2}, lora_path=["a2", "a1"])
    for out, name in zip(outs, ["a2", "a2", "a1", "a1"], strict=True):
        prompt = PROMPTS[0] if name == "a2" else PROMPTS[1]
        assert max_diff_of_replies(Reference(model_dir, adapters[name]), [prompt], [out]) < TOLERANCE


def test_a_duplicate_name_an_unknown_name_and_a_wrong_count_are_refused(client, adapters):
    with pytest.raises(EngineError, match="already loaded") as dup:
        client.load_lora_adapter("a1", str(adapters["a2"]))
    assert dup.value.status == 400
    with pytest.raises(EngineError, match="lora_path: LoRA adapter 'nope' has never been loaded") as unknown:
        client.generate(PROMPTS, SAMPLING, lora_path="nope")
    assert unknown.value.status == 400
    with pytest.raises(EngineError, match="lora_path: 2 adapter names for 3 inputs"):
        client.generate(PROMPTS, SAMPLING, lora_path=["a1", "a2"])
    with pytest.raises(EngineError, match="lora_name: LoRA adapter 'nope' is not loaded"):
        client.unload_lora_adapter("nope")


def test_an_unloaded_name_is_loaded_again_on_request_unless_its_directory_is_gone(
    client, model_dir, adapters, tmp_path
):
    """As SGLang 0.5.23: a request naming an unloaded adapter reloads it from its directory."""
    path = shutil.copytree(adapters["a1"], tmp_path / "v7")
    client.load_lora_adapter("v7", str(path))
    assert "v7" not in client.unload_lora_adapter("v7")
    outs = client.generate(PROMPTS[:1], SAMPLING, lora_path="v7")
    assert max_diff_of_replies(Reference(model_dir, adapters["a1"]), PROMPTS[:1], outs) < TOLERANCE
    client.unload_lora_adapter("v7")  # loaded again by that request
    shutil.rmtree(path)
    with pytest.raises(
        EngineError, match="lora_path: failed to load unloaded LoRA adapter 'v7' again"
    ) as gone:
        client.generate(PROMPTS[:1], SAMPLING, lora_path="v7")
    assert gone.value.status == 400


def test_an_unload_waits_for_the_generation_using_the_adapter(client, adapters, tmp_path):
    path = shutil.copytree(adapters["a2"], tmp_path / "v8")
    client.load_lora_adapter("v8", str(path))
    # the reply still has to travel and parse: within 0.5 s of the generation's end
    assert_unload_waits(client, "v8", inputs=32, tokens=1500, hold_s=1.0, reply_s=0.5)
    assert "v8" not in client.load_lora_adapter("v9", str(adapters["a2"]))
