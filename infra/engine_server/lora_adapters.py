"""A PEFT LoRA adapter directory as the built-in engine serves it.

The directory is what `PeftModel.save_pretrained` writes: `adapter_config.json` and
`adapter_model.safetensors`, whose keys name the adapted linear layers
(`base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight`). A targeted layer then
computes W x + (lora_alpha / r) * B (A x). What would change that formula (DoRA,
rank-stabilised scaling, per-module ranks, biases, ...) is refused with a 400 naming the
field, and so is an adapter whose tensors do not fit this model (another base model).
Weights come from safetensors only: nothing read here is unpickled.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file

from infra.config import BUILTIN_LORA_TARGETS
from infra.engine_server.protocol import BadRequest

# The linear layers the engine applies adapters to; the config refuses others early
SUPPORTED_TARGETS = BUILTIN_LORA_TARGETS
CONFIG_FILE, WEIGHTS_FILE = "adapter_config.json", "adapter_model.safetensors"
# adapter_config.json fields that, set, ask for something other than W x + (alpha/r) B A x
_REFUSED = {
    "use_dora": "DoRA adapters",
    "use_rslora": "rank-stabilised scaling (alpha / sqrt(r))",
    "rank_pattern": "per-module ranks",
    "alpha_pattern": "per-module alphas",
    "modules_to_save": "fully trained modules beside the adapter",
    "lora_bias": "LoRA biases",
    "fan_in_fan_out": "transposed (Conv1D) weights",
    "target_parameters": "adapters on parameters",
    "trainable_token_indices": "trained token embeddings",
    "layer_replication": "replicated layers",
    "use_qalora": "QA-LoRA",
    "alora_invocation_tokens": "activated LoRA",
}
_KEY = re.compile(r"^base_model\.model\.(?P<module>.+)\.lora_(?P<part>[AB])\.weight$")
# peft also saves the frozen weight of an adapted output (or input) embedding layer
_BASE_KEY = re.compile(r"^base_model\.model\.(?P<module>.+)\.base_layer\.weight$")
_LAYER = re.compile(r"(?:^|\.)layers\.(?P<index>\d+)\.(?:self_attn|mlp)\.(?P<proj>\w+)$")

Pair = tuple[torch.Tensor, torch.Tensor]


@dataclass(frozen=True, eq=False)  # compared and hashed by identity: one load, one adapter
class LoraAdapter:
    name: str
    path: str
    rank: int
    scaling: float
    # per module of the model ("model.layers.0.self_attn.q_proj", "lm_head"): A [r, in]
    # and scaling * B [out, r], in the model's dtype and on its device
    modules: dict[str, Pair]

    def layer(self, index: int) -> dict[str, Pair]:
        """The pairs of decoder layer `index`, by projection name ("q_proj", ...)."""
        found = {}
        for module, pair in self.modules.items():
            match = _LAYER.search(module)
            if match and int(match["index"]) == index:
                found[match["proj"]] = pair
        return found


def check_config(config: dict) -> tuple[int, float, list[str]]:
    """r, lora_alpha and target_modules of an adapter_config.json this engine can serve."""
    if config.get("peft_type", "LORA") != "LORA":
        raise BadRequest(f"peft_type: {config.get('peft_type')!r} adapters are not supported (LORA only)")
    for field, what in _REFUSED.items():
        if config.get(field):
            raise BadRequest(f"{field}: {what} are not supported by the built-in engine")
    if config.get("bias", "none") != "none":
        raise BadRequest(f"bias: {config['bias']!r} is not supported (adapters without biases only)")
    rank, alpha, targets = config.get("r"), config.get("lora_alpha"), config.get("target_modules")
    if not isinstance(rank, int) or rank < 1:
        raise BadRequest(f"r: a positive integer rank is required, got {rank!r}")
    if not isinstance(alpha, int | float) or isinstance(alpha, bool):
        raise BadRequest(f"lora_alpha: a number is required, got {alpha!r}")
    if not isinstance(targets, list) or not targets:
        raise BadRequest(f"target_modules: a list of module names is required, got {targets!r}")
    unsupported = sorted(set(targets) - set(SUPPORTED_TARGETS))
    if unsupported:
        raise BadRequest(
            f"target_modules: {unsupported} not supported (supported: {list(SUPPORTED_TARGETS)})"
        )
    return rank, float(alpha), targets


def _read_files(path: str) -> tuple[dict, dict[str, torch.Tensor]]:
    if not os.path.isfile(os.path.join(path, CONFIG_FILE)):
        raise BadRequest(f"lora_path: {path!r} is not a PEFT adapter directory (no {CONFIG_FILE} in it)")
    try:
        with open(os.path.join(path, CONFIG_FILE)) as f:
            config = json.load(f)
    except (OSError, ValueError) as exc:
        raise BadRequest(f"lora_path: cannot read {CONFIG_FILE}: {exc}") from exc
    if not isinstance(config, dict):
        raise BadRequest(f"lora_path: {CONFIG_FILE} does not hold a JSON object")
    weights = os.path.join(path, WEIGHTS_FILE)
    if not os.path.isfile(weights):
        raise BadRequest(f"lora_path: no {WEIGHTS_FILE} in {path!r} (safetensors only; nothing is unpickled)")
    try:
        return config, load_file(weights, device="cpu")
    except (OSError, SafetensorError) as exc:
        raise BadRequest(f"{WEIGHTS_FILE}: cannot read it: {exc}") from exc


def _same_base(key: str, tensor: torch.Tensor, model: torch.nn.Module) -> None:
    """A saved base weight must be the model's own: the adapter was trained on it."""
    module_name = _BASE_KEY.match(key)["module"]
    try:
        weight = model.get_submodule(module_name).weight
    except AttributeError:
        weight = None
    if weight is None or tensor.shape != weight.shape or not torch.equal(tensor.to(weight), weight):
        raise BadRequest(
            f"{WEIGHTS_FILE}: {key!r} is not this model's {module_name} weight (an adapter of another base model?)"
        )


def _pairs(tensors: dict[str, torch.Tensor], model: torch.nn.Module) -> dict[str, dict[str, torch.Tensor]]:
    """The tensors by module name, then "A" / "B"."""
    pairs: dict[str, dict[str, torch.Tensor]] = {}
    for key, tensor in tensors.items():
        if _BASE_KEY.match(key):
            _same_base(key, tensor, model)
            continue
        match = _KEY.match(key)
        if match is None:
            raise BadRequest(f"{WEIGHTS_FILE}: {key!r} is not a LoRA A or B weight of a linear layer")
        pairs.setdefault(match["module"], {})[match["part"]] = tensor
    for module, pair in pairs.items():
        if set(pair) != {"A", "B"}:
            raise BadRequest(f"{WEIGHTS_FILE}: {module!r} has lora_{''.join(pair)} only, not both A and B")
    return pairs


def _fit(module_name: str, pair: dict, model: torch.nn.Module, rank: int, targets: list[str]) -> None:
    """Refuse a pair that does not belong to a targeted linear layer of this model."""
    if module_name.rsplit(".", 1)[-1] not in targets:
        raise BadRequest(f"{WEIGHTS_FILE}: {module_name!r} is not among target_modules {targets}")
    try:
        layer = model.get_submodule(module_name)
    except AttributeError:
        layer = None
    if not isinstance(layer, torch.nn.Linear):
        raise BadRequest(
            f"{WEIGHTS_FILE}: the model has no linear layer {module_name!r} (an adapter of another base model?)"
        )
    want_a, want_b = (rank, layer.in_features), (layer.out_features, rank)
    if tuple(pair["A"].shape) != want_a or tuple(pair["B"].shape) != want_b:
        raise BadRequest(
            f"{WEIGHTS_FILE}: {module_name!r} has A {list(pair['A'].shape)} and B {list(pair['B'].shape)}, "
            f"this model needs A {list(want_a)} and B {list(want_b)} for r={rank} (another base model?)"
        )


def read_adapter(name: str, path: str, model: torch.nn.Module) -> LoraAdapter:
    """The adapter in directory `path`, checked against `model`; BadRequest naming what is wrong."""
    if not os.path.isdir(path):
        raise BadRequest(f"lora_path: {path!r} is not a directory on the engine's machine")
    config, tensors = _read_files(path)
    rank, alpha, targets = check_config(config)
    pairs = _pairs(tensors, model)
    if not pairs:
        raise BadRequest(f"{WEIGHTS_FILE}: holds no LoRA weights")
    weight = model.get_input_embeddings().weight
    scaling = alpha / rank
    modules = {}
    for module_name, pair in pairs.items():
        _fit(module_name, pair, model, rank, targets)
        a = pair["A"].to(weight.device, weight.dtype)
        b = (pair["B"].to(torch.float32) * scaling).to(weight.device, weight.dtype)
        modules[module_name] = (a.contiguous(), b.contiguous())
    return LoraAdapter(name=name, path=path, rank=rank, scaling=scaling, modules=modules)
