"""LoRA in the built-in engine's decode: W x + (alpha/r) B (A x) on the adapted layers gives
transformers + peft's logprobs, on the lean Llama step (fused and not) and on transformers'
forward; adapter directories the engine cannot serve are refused naming the field."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from infra.config import TinyModelConfig
from infra.engine_server import lean_llama
from infra.engine_server.lora_adapters import read_adapter
from infra.engine_server.protocol import BadRequest
from infra.engine_server.sampling import sample_batch
from infra.model.tiny import build_tiny_model
from tests.lora import ALL_TARGETS, Reference, make_adapter, max_diff

PROMPTS = [[1, 5, 6, 7, 8, 9, 10, 11], [1, 20], [1, 30, 31, 32, 33]]
TOLERANCE = 1e-4


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    torch.set_num_threads(1)
    return build_tiny_model(tmp_path_factory.mktemp("tiny"), TinyModelConfig())


@pytest.fixture(scope="module")
def model(model_dir: Path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def adapter_dir(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_adapter(model_dir, tmp_path_factory.mktemp("adapter"), seed=1, targets=ALL_TARGETS)


def _sampled(model, adapter, seed: int = 0):
    return sample_batch(
        model,
        PROMPTS,
        max_new_tokens=12,
        eos_token_id=2,
        ignore_eos=True,
        generator=torch.Generator().manual_seed(seed),
        lora=adapter,
    )


@pytest.mark.parametrize("path", ["lean-fused", "lean", "transformers"])
def test_adapted_logprobs_are_peft_s(model, model_dir, adapter_dir, path, monkeypatch):
    if path == "lean":
        monkeypatch.setattr(lean_llama, "should_fuse", lambda model: False)
    if path == "transformers":
        monkeypatch.setattr(lean_llama, "supports", lambda model: False)
    adapter = read_adapter("a1", str(adapter_dir), model)
    assert "lm_head" in adapter.modules and len(adapter.modules) == 7 * 2 + 1
    outs = _sampled(model, adapter)
    adapted, base = Reference(model_dir, adapter_dir), Reference(model_dir)
    diffs = [max_diff(adapted, p, o.output_ids, o.logprobs) for p, o in zip(PROMPTS, outs, strict=True)]
    print(f"{path}: max |engine - peft| logprob {max(diffs):.2e}")
    assert max(diffs) < TOLERANCE
    # the adapter matters: the base model gives these tokens other logprobs
    off = [max_diff(base, p, o.output_ids, o.logprobs) for p, o in zip(PROMPTS, outs, strict=True)]
    assert max(off) > 100 * TOLERANCE
    # and without it the engine is the base model again
    plain = _sampled(model, None)
    assert (
        max(max_diff(base, p, o.output_ids, o.logprobs) for p, o in zip(PROMPTS, plain, strict=True))
        < TOLERANCE
    )


def test_an_adapter_on_some_modules_of_one_layer(model, model_dir, tmp_path):
    adapter_dir = make_adapter(
        model_dir,
        tmp_path / "a",
        seed=3,
        r=2,
        alpha=5,
        targets=["k_proj", "up_proj"],
        layers_to_transform=[1],
    )
    adapter = read_adapter("partial", str(adapter_dir), model)
    assert sorted(adapter.modules) == ["model.layers.1.mlp.up_proj", "model.layers.1.self_attn.k_proj"]
    outs = _sampled(model, adapter, seed=1)
    reference = Reference(model_dir, adapter_dir)
    assert (
        max(max_diff(reference, p, o.output_ids, o.logprobs) for p, o in zip(PROMPTS, outs, strict=True))
        < TOLERANCE
    )


def _edited(adapter_dir: Path, tmp_path: Path, **changes) -> Path:
    copy = Path(shutil.copytree(adapter_dir, tmp_path / "edited"))
    config = json.loads((copy / "adapter_config.json").read_text())
    (copy / "adapter_config.json").write_text(json.dumps({**config, **changes}))
    return copy


@pytest.mark.parametrize(
    "changes,field",
    [
        ({"use_dora": True}, "use_dora"),
        ({"use_rslora": True}, "use_rslora"),
        ({"rank_pattern": {"q_proj": 8}}, "rank_pattern"),
        ({"bias": "all"}, "bias"),
        ({"modules_to_save": ["lm_head"]}, "modules_to_save"),
        ({"target_modules": ["q_proj", "embed_tokens"]}, "target_modules"),
        ({"target_modules": ".*proj"}, "target_modules"),
        ({"r": 8}, "adapter_model.safetensors"),  # the tensors are rank 4
        ({"peft_type": "IA3"}, "peft_type"),
    ],
)
def test_what_the_engine_cannot_serve_is_refused_naming_the_field(
    model, adapter_dir, tmp_path, changes, field
):
    with pytest.raises(BadRequest, match=f"^{field}: "):
        read_adapter("bad", str(_edited(adapter_dir, tmp_path, **changes)), model)


def test_an_adapter_saved_with_other_output_layer_weights_is_refused(model, adapter_dir, tmp_path):
    """peft saves an adapted lm_head's frozen weight beside its A and B: it must be the model's."""
    from safetensors.torch import load_file, save_file

    copy = Path(shutil.copytree(adapter_dir, tmp_path / "other-head"))
    tensors = load_file(copy / "adapter_model.safetensors")
    key = "base_model.model.lm_head.base_layer.weight"
    assert torch.equal(tensors[key], model.lm_head.weight)
    save_file({**tensors, key: tensors[key] + 1e-3}, copy / "adapter_model.safetensors")
    with pytest.raises(BadRequest, match="not this model's lm_head weight"):
        read_adapter("other-head", str(copy), model)


def test_an_adapter_of_another_base_model_or_no_adapter_is_refused(model, tmp_path):
    other = build_tiny_model(tmp_path / "other", TinyModelConfig(hidden_size=32, intermediate_size=64))
    with pytest.raises(BadRequest, match="lm_head weight .*another base model"):
        read_adapter("other", str(make_adapter(other, tmp_path / "other-adapter", seed=1)), model)
    projections = make_adapter(other, tmp_path / "other-projections", seed=1, targets=["q_proj"])
    with pytest.raises(BadRequest, match="this model needs A .*another base model"):
        read_adapter("other", str(projections), model)
    with pytest.raises(BadRequest, match="^lora_path: .*not a directory"):
        read_adapter("missing", str(tmp_path / "nothing-here"), model)
    with pytest.raises(BadRequest, match="^lora_path: .*no adapter_config.json"):
        read_adapter("model", str(other), model)
    pickled = make_adapter(other, tmp_path / "pickled", seed=1, targets=["q_proj"])
    (pickled / "adapter_model.safetensors").rename(pickled / "adapter_model.bin")
    with pytest.raises(BadRequest, match="no adapter_model.safetensors"):
        read_adapter("pickled", str(pickled), model)
