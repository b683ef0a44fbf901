"""LoRA adapters on a causal LM, through peft: the wrap, and the two ways its weights leave
the trainer (a PEFT adapter directory, or full weights with the adapter merged in).

Model code only: nothing here knows the model is sharded. The merge works on whatever
tensors it is given (full ones, or a rank's rows of a weight and of its B, see
infra/trainer/lora_merge.py).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

import torch
from torch import nn

from infra.config import LoraConfig

ADAPTER = "default"  # peft's name for the one adapter a model gets from get_peft_model
# what peft's wrap adds in front of the base model's parameter names, and around a wrapped
# linear layer's own weight
_PREFIX = "base_model.model."
_BASE_LAYER = ".base_layer"


def apply_lora(model: nn.Module, lora: LoraConfig) -> nn.Module:
    """Wrap `model` with a fresh adapter; only the adapter's parameters require gradients.

    peft initialises B to zero, so the wrapped model computes what the base model does
    until the first optimizer step."""
    from peft import LoraConfig as PeftLoraConfig
    from peft import get_peft_model

    config = PeftLoraConfig(
        r=lora.r,
        lora_alpha=lora.alpha,
        lora_dropout=lora.dropout,
        target_modules=list(lora.target_modules),
        bias="none",
        task_type="CAUSAL_LM",
    )
    return get_peft_model(model, config)


def base_name(peft_name: str) -> str:
    """A wrapped model's parameter name as the base model (and every engine) names it."""
    return peft_name.removeprefix(_PREFIX).replace(_BASE_LAYER, "")


def is_adapter_param(name: str) -> bool:
    return ".lora_A." in name or ".lora_B." in name


@dataclass
class LoraLayer:
    """One adapted linear layer: its frozen weight and the adapter's factors."""

    name: str  # the base model's name of `weight`
    weight: torch.Tensor
    a: torch.Tensor  # [r, in]
    b: torch.Tensor  # [out, r]
    scale: float  # alpha / r


def lora_layers(model: nn.Module) -> list[LoraLayer]:
    """Every adapted linear layer of a peft-wrapped model, in module order."""
    from peft.tuners.lora import LoraLayer as PeftLoraLayer

    found = []
    for module_name, module in model.named_modules():
        if isinstance(module, PeftLoraLayer) and ADAPTER in module.lora_A:
            found.append(
                LoraLayer(
                    name=base_name(f"{module_name}.weight"),
                    weight=module.base_layer.weight,
                    a=module.lora_A[ADAPTER].weight,
                    b=module.lora_B[ADAPTER].weight,
                    scale=float(module.scaling[ADAPTER]),
                )
            )
    return found


def merge_delta(b: torch.Tensor, a: torch.Tensor, scale: float) -> torch.Tensor:
    """The adapter's update of a weight (or of the rows of it that `b`'s rows match)."""
    return (b.float() @ a.float()).mul_(scale)


def merged_state_dict(state: dict[str, torch.Tensor], model: nn.Module) -> dict[str, torch.Tensor]:
    """A wrapped model's full state dict as the base model's, with every adapter merged in."""
    layers = {layer.name: layer for layer in lora_layers(model)}
    adapters = {base_name(k): v for k, v in state.items() if is_adapter_param(k)}
    merged = {}
    for key, value in state.items():
        if is_adapter_param(key):
            continue
        name = base_name(key)
        layer = layers.get(name)
        if layer is not None:
            prefix = name.removesuffix(".weight")
            a = adapters[f"{prefix}.lora_A.{ADAPTER}.weight"]
            b = adapters[f"{prefix}.lora_B.{ADAPTER}.weight"]
            value = (value.float() + merge_delta(b, a, layer.scale)).to(value.dtype)
        merged[name] = value
    return merged


def save_adapter(state: dict[str, torch.Tensor], model: nn.Module, directory: str) -> None:
    """Write a PEFT adapter directory (`adapter_config.json`, `adapter_model.safetensors`)
    from a wrapped model's full state dict; `PeftModel.from_pretrained(base, directory)`
    loads it."""
    from peft import get_peft_model_state_dict
    from safetensors.torch import save_file

    adapter = get_peft_model_state_dict(model, state_dict=state, adapter_name=ADAPTER)
    os.makedirs(directory, exist_ok=True)
    save_file(
        {k: v.contiguous() for k, v in adapter.items()}, os.path.join(directory, "adapter_model.safetensors")
    )
    model.peft_config[ADAPTER].save_pretrained(directory)
    # peft records the base model's origin; ours may be a temporary local copy
    path = os.path.join(directory, "adapter_config.json")
    with open(path) as f:
        config = json.load(f)
    config["base_model_name_or_path"] = None
    with open(path, "w") as f:
        json.dump(config, f, indent=2)
