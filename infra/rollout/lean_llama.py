"""A lean decode step for Llama models: the same math as transformers' LlamaForCausalLM,
without its per-call machinery.

On small models the engine's time goes less to arithmetic than to what surrounds it in
transformers' forward (mask building, cache objects, attention dispatch, a Python call per
submodule), and that cost is paid once per generated token. This step reads the weights
straight from the HF modules (so weight updates and memory release act on it as before),
keeps keys and values in preallocated tensors and the padding mask as one boolean tensor.
It gives the same logits as the HF forward (a unit test compares them); models it does not
cover exactly (biases, rope scaling, sliding windows, other architectures) use the HF path.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def supports(model: nn.Module) -> bool:
    """True for a plain Llama: no biases, default RoPE, SiLU MLP, full attention."""
    cfg = getattr(model, "config", None)
    if type(model).__name__ != "LlamaForCausalLM" or cfg is None:
        return False
    core = model.model
    attn = core.layers[0].self_attn
    return (
        not getattr(cfg, "attention_bias", False)
        and not getattr(cfg, "mlp_bias", False)
        and getattr(cfg, "hidden_act", "silu") == "silu"
        and getattr(cfg, "pretraining_tp", 1) == 1
        and getattr(core.rotary_emb, "rope_type", "default") == "default"
        and getattr(core.rotary_emb, "attention_scaling", 1.0) == 1.0
        and abs(attn.scaling - attn.head_dim**-0.5) < 1e-12
    )


def _rms(x: torch.Tensor, norm: nn.Module) -> torch.Tensor:
    # as LlamaRMSNorm: the variance in float32, the result back in the input dtype
    x32 = x.to(torch.float32)
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + norm.variance_epsilon)
    return norm.weight * x32.to(x.dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class LeanLlamaDecoder:
    """Prefill, then one token per call; `__call__` returns the last position's logits [B, V]."""

    def __init__(self, model: nn.Module, prompt_mask: torch.Tensor, max_new_tokens: int) -> None:
        self.model, self.core = model, model.model
        cfg = model.config
        attn = self.core.layers[0].self_attn
        self.heads, self.kv_heads, self.head_dim = (
            cfg.num_attention_heads,
            cfg.num_key_value_heads,
            attn.head_dim,
        )
        rows, width = prompt_mask.shape
        total = width + max_new_tokens
        param = next(model.parameters())
        shape = (rows, self.kv_heads, total, self.head_dim)
        self.keys = [param.new_zeros(shape) for _ in self.core.layers]
        self.values = [param.new_zeros(shape) for _ in self.core.layers]
        # columns a query may attend to: the prompt's real tokens, then each generated one
        self.allowed = torch.zeros(rows, total, dtype=torch.bool, device=param.device)
        self.allowed[:, :width] = prompt_mask.bool()
        self.filled = 0

    def __call__(self, input_ids: torch.Tensor, position_ids: torch.Tensor) -> torch.Tensor:
        rows, length = input_ids.shape
        start, end = self.filled, self.filled + length
        if start:  # a decode step: its own column becomes visible
            self.allowed[:, start:end] = True
        h = self.core.embed_tokens(input_ids)
        freqs = position_ids[..., None].float() * self.core.rotary_emb.inv_freq.to(h.device, torch.float)
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos().to(h.dtype)[:, None], emb.sin().to(h.dtype)[:, None]
        causal = torch.ones(length, end, dtype=torch.bool, device=h.device).tril(start)
        # every query also sees its own column: a left-pad position then has one finite
        # score instead of none (no NaN); real tokens never attend to pad columns anyway
        own = torch.eye(length, end, dtype=torch.bool, device=h.device).roll(start, dims=1)
        mask = (self.allowed[:, None, None, :end] & causal) | own
        for i, layer in enumerate(self.core.layers):
            attn, mlp = layer.self_attn, layer.mlp
            x = _rms(h, layer.input_layernorm)
            q = F.linear(x, attn.q_proj.weight).view(rows, length, self.heads, self.head_dim).transpose(1, 2)
            k = (
                F.linear(x, attn.k_proj.weight)
                .view(rows, length, self.kv_heads, self.head_dim)
                .transpose(1, 2)
            )
            v = (
                F.linear(x, attn.v_proj.weight)
                .view(rows, length, self.kv_heads, self.head_dim)
                .transpose(1, 2)
            )
            q, k = q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin
            self.keys[i][:, :, start:end] = k
            self.values[i][:, :, start:end] = v
            o = F.scaled_dot_product_attention(
                q,
                self.keys[i][:, :, :end],
                self.values[i][:, :, :end],
                attn_mask=mask,
                enable_gqa=self.kv_heads != self.heads,
            )
            h = h + F.linear(o.transpose(1, 2).reshape(rows, length, -1), attn.o_proj.weight)
            x = _rms(h, layer.post_attention_layernorm)
            gate = F.silu(F.linear(x, mlp.gate_proj.weight)) * F.linear(x, mlp.up_proj.weight)
            h = h + F.linear(gate, mlp.down_proj.weight)
        self.filled = end
        return F.linear(_rms(h[:, -1], self.core.norm), self.model.lm_head.weight)
