"""A lean decode step for Llama models: the same math as transformers' LlamaForCausalLM,
without its per-call machinery.

On small models the engine's time goes less to arithmetic than to what surrounds it in
transformers' forward (mask building, cache objects, attention dispatch, a Python call per
submodule), and that cost is paid once per generated token. This step reads the weights
straight from the HF modules once per batch (weight updates and memory release happen
between batches, so they act on it as before). Per step it does only the arithmetic: keys
(stored transposed) and values sit in tensors preallocated for the whole batch, the
padding mask is one additive tensor built once, the RoPE tables are computed once for
every position the batch reaches, and attention is two batched matmuls that group the
query heads by their key/value head (no repeat for GQA). Small float32 models also get
each layer's q/k/v projections and its gate/up projections fused into one matmul each
(`FUSE_MAX_BYTES`), their norms' weights folded into those matmuls. It gives the same logits as the HF forward (a unit test compares them); models it does not
cover exactly (biases, rope scaling, sliding windows, other architectures) use the HF path.
A LoRA adapter, when given, adds its low-rank term to the projections it targets
(`lora_apply`), fused alongside them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from infra.engine_server.lora_apply import Pair, add_single, stacked

if TYPE_CHECKING:
    from infra.engine_server.lora_adapters import LoraAdapter


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


# Fusing a layer's matmuls copies its weights once per batch. That pays where a step is
# bound by the cost per op rather than by the weights' size (small models on CPU, which is
# what this engine serves), and in float32 only, where folding a norm's weight into the next
# matmul (and taking the norm from `vector_norm`, fewer ops) changes results by float32
# rounding alone. Larger models, and other dtypes, keep the module weights and HF's norm.
FUSE_MAX_BYTES = 64 * 2**20


def _rms(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    # as LlamaRMSNorm: the variance in float32, the result back in the input dtype; in
    # float32 that is exactly torch's fused rms_norm
    if x.dtype == torch.float32:
        return F.rms_norm(x, weight.shape, weight, eps)
    x32 = x.to(torch.float32)
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x32.to(x.dtype)


def _unit_rms(x: torch.Tensor, eps: torch.Tensor) -> torch.Tensor:
    """x / sqrt(mean(x^2) + eps) over the last dim, for float32 (the fused path): the same
    value as rms_norm up to rounding, in 4 ops instead of its ~7. `eps` is a 1-element tensor."""
    norm = torch.linalg.vector_norm(x, dim=-1, keepdim=True)
    return x * torch.addcmul(eps, norm, norm, value=1.0 / x.shape[-1]).rsqrt_()


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def _rotated_rows(weight: torch.Tensor, head_dim: int) -> torch.Tensor:
    """W' with W' x == rotate_half(W x) per head: RoPE's rotation done by the matmul."""
    w = weight.view(-1, head_dim, weight.shape[-1])
    return _rotate_half(w.transpose(1, 2)).transpose(1, 2).reshape(weight.shape)


def should_fuse(model: nn.Module) -> bool:
    """Fuse the layers' matmuls: float32 layers of at most `FUSE_MAX_BYTES` in all."""
    layers = [p for name, p in model.named_parameters() if ".layers." in name]
    return (
        all(p.dtype == torch.float32 for p in layers)
        and sum(p.numel() * p.element_size() for p in layers) <= FUSE_MAX_BYTES
    )


class _Layer:
    """One decoder layer as the step reads it: attribute lookups on the HF modules cost more
    than the math on small models, so they happen once per batch."""

    def __init__(
        self,
        layer: nn.Module,
        heads: int,
        kv_heads: int,
        head_dim: int,
        fuse: bool,
        lora: dict[str, Pair] | None = None,
    ) -> None:
        attn, mlp = layer.self_attn, layer.mlp
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, head_dim
        self.in_eps = layer.input_layernorm.variance_epsilon
        self.post_eps = layer.post_attention_layernorm.variance_epsilon
        self.wo_t, self.wd_t = attn.o_proj.weight.t(), mlp.down_proj.weight.t()
        self.fuse = fuse
        self.lora = lora = lora or {}
        if fuse:
            # one matmul gives q and k, their rotated halves and v; one gives gate and up.
            # The norms' weights scale the matmul's input columns.
            wq, wk = attn.q_proj.weight, attn.k_proj.weight
            rotated = [_rotated_rows(wq, head_dim), _rotated_rows(wk, head_dim)]
            w_in = torch.cat([wq, wk, *rotated, attn.v_proj.weight])
            self.w_in = w_in * layer.input_layernorm.weight
            w_gu = torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight])
            self.w_gu = w_gu * layer.post_attention_layernorm.weight
            self.qk_width, self.inter = (heads + kv_heads) * head_dim, mlp.gate_proj.weight.shape[0]
            self.in_eps_t, self.post_eps_t = wq.new_full((1,), self.in_eps), wq.new_full((1,), self.post_eps)
            self._fuse_lora(layer, lora)
        else:
            self.in_w, self.post_w = layer.input_layernorm.weight, layer.post_attention_layernorm.weight
            self.wq, self.wk, self.wv = attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight
            self.wg, self.wu = mlp.gate_proj.weight, mlp.up_proj.weight

    def _fuse_lora(self, layer: nn.Module, lora: dict[str, Pair]) -> None:
        """The adapter's A's and B's laid out as the fused matmuls' weights are."""
        q_rows, kv_rows = self.heads * self.head_dim, self.kv_heads * self.head_dim

        def rotated(b: torch.Tensor) -> torch.Tensor:
            return _rotated_rows(b, self.head_dim)

        self.lora_in = stacked(
            lora,
            [
                ("q_proj", q_rows, None),
                ("k_proj", kv_rows, None),
                ("q_proj", q_rows, rotated),
                ("k_proj", kv_rows, rotated),
                ("v_proj", kv_rows, None),
            ],
            layer.input_layernorm.weight,
        )
        outputs = [("gate_proj", self.inter, None), ("up_proj", self.inter, None)]
        self.lora_gu = stacked(lora, outputs, layer.post_attention_layernorm.weight)

    def attn_out(self, h: torch.Tensor, o: torch.Tensor) -> torch.Tensor:
        """h plus the attention output's projection."""
        return add_single(torch.addmm(h, o, self.wo_t), o, self.lora.get("o_proj"))

    def qkv(self, h: torch.Tensor, rows: int, length: int, cos: torch.Tensor, sin: torch.Tensor) -> tuple:
        """q [B, L, H, D] and k [B, L, KV, D] with RoPE applied, v [B, L, KV, D]."""
        heads, kv, dim = self.heads, self.kv_heads, self.head_dim
        if self.fuse:
            x = _unit_rms(h, self.in_eps_t)
            y = F.linear(x, self.w_in)
            if self.lora_in is not None:
                y = self.lora_in.add(y, x)
            width = self.qk_width
            qk = y[:, :width].view(rows, length, heads + kv, dim)
            qk = torch.addcmul(qk * cos, y[:, width : 2 * width].view(rows, length, heads + kv, dim), sin)
            return qk[:, :, :heads], qk[:, :, heads:], y[:, 2 * width :].view(rows, length, kv, dim)
        x = _rms(h, self.in_w, self.in_eps)
        lora = self.lora
        q = add_single(F.linear(x, self.wq), x, lora.get("q_proj")).view(rows, length, heads, dim)
        k = add_single(F.linear(x, self.wk), x, lora.get("k_proj")).view(rows, length, kv, dim)
        q, k = q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin
        return q, k, add_single(F.linear(x, self.wv), x, lora.get("v_proj")).view(rows, length, kv, dim)

    def mlp(self, h: torch.Tensor) -> torch.Tensor:
        """h plus the MLP of h."""
        lora = self.lora
        if self.fuse:
            x = _unit_rms(h, self.post_eps_t)
            y = F.linear(x, self.w_gu)
            if self.lora_gu is not None:
                y = self.lora_gu.add(y, x)
            act = F.silu(y[:, : self.inter]) * y[:, self.inter :]
        else:
            x = _rms(h, self.post_w, self.post_eps)
            gate = add_single(F.linear(x, self.wg), x, lora.get("gate_proj"))
            act = F.silu(gate) * add_single(F.linear(x, self.wu), x, lora.get("up_proj"))
        return add_single(torch.addmm(h, act, self.wd_t), act, lora.get("down_proj"))


class LeanLlamaDecoder:
    """Prefill, then one token per call; `__call__` returns the last position's logits [B, V]."""

    def __init__(
        self,
        model: nn.Module,
        prompt_mask: torch.Tensor,
        max_new_tokens: int,
        fuse: bool | None = None,
        lora: LoraAdapter | None = None,
    ) -> None:
        """`fuse`: fuse the layers' matmuls (None: when `should_fuse` says so). `lora`: the
        adapter every row of the batch runs with (None: the base weights)."""
        cfg, core = model.config, model.model
        attn = core.layers[0].self_attn
        self.heads, self.kv_heads, self.head_dim = (
            cfg.num_attention_heads,
            cfg.num_key_value_heads,
            attn.head_dim,
        )
        self.group = self.heads // self.kv_heads  # query heads per key/value head
        self.scaling = attn.scaling
        self.embed = core.embed_tokens.weight
        fuse = should_fuse(model) if fuse is None else fuse
        self.layers = [
            _Layer(layer, self.heads, self.kv_heads, self.head_dim, fuse, lora.layer(i) if lora else None)
            for i, layer in enumerate(core.layers)
        ]
        # the final norm's weight folded into the head when fused, as in the layers
        self.fuse, self.norm_eps, self.norm_w = fuse, core.norm.variance_epsilon, core.norm.weight
        self.norm_eps_t = self.embed.new_full((1,), self.norm_eps)
        self.lm_head = model.lm_head.weight * core.norm.weight if fuse else model.lm_head.weight
        head = lora.modules if lora else {}
        rows = self.lm_head.shape[0]
        self.lm_head_lora = stacked(head, [("lm_head", rows, None)], core.norm.weight if fuse else None)
        rows, width = prompt_mask.shape
        self.total = total = width + max_new_tokens
        dtype, device = self.embed.dtype, self.embed.device
        kv_rows = rows * self.kv_heads
        self.keys = [self.embed.new_zeros(kv_rows, self.head_dim, total) for _ in self.layers]
        self.values = [self.embed.new_zeros(kv_rows, total, self.head_dim) for _ in self.layers]
        # columns a query may attend to, per (row, kv head): the prompt's real tokens, then
        # every generated one (a decode step's own column is the last it reads)
        allowed = torch.ones(rows, total, dtype=torch.bool, device=device)
        allowed[:, :width] = prompt_mask.bool()
        self.allowed = allowed
        bias = torch.zeros(rows, total, dtype=dtype, device=device).masked_fill(~allowed, float("-inf"))
        self.decode_bias = bias.repeat_interleave(self.kv_heads, dim=0)[:, None]  # [B*KV, 1, total]
        # as LlamaRotaryEmbedding (default rope, scaling 1): angles in float32, then the dtype
        inv_freq = core.rotary_emb.inv_freq.to(device, torch.float32)
        freqs = torch.arange(total, device=device, dtype=torch.float32)[:, None] * inv_freq[None]
        emb = torch.cat((freqs, freqs), dim=-1)
        self.cos, self.sin = emb.cos().to(dtype), emb.sin().to(dtype)
        self.filled = 0

    def expand(self, index: torch.Tensor) -> None:
        """Make row i of the batch a copy of row `index[i]` (its cache, its padding), so a
        batch prefilled once per distinct prompt decodes every sample of each."""
        rows, kv = len(self.allowed), self.kv_heads
        self.keys = [k.view(rows, kv, *k.shape[1:])[index].flatten(0, 1) for k in self.keys]
        self.values = [v.view(rows, kv, *v.shape[1:])[index].flatten(0, 1) for v in self.values]
        self.allowed = self.allowed[index]
        self.decode_bias = self.decode_bias.view(rows, kv, 1, -1)[index].flatten(0, 1)

    def _bias(self, rows: int, length: int, start: int, end: int) -> torch.Tensor:
        """The additive mask of this call's queries, [B*KV, G*L or 1, end]."""
        if length == 1:
            return self.decode_bias[..., :end]
        device = self.allowed.device
        causal = torch.ones(length, end, dtype=torch.bool, device=device).tril(start)
        # every query also sees its own column: a left-pad position then has one finite
        # score instead of none (no NaN); real tokens never attend to pad columns anyway
        own = torch.eye(length, end, dtype=torch.bool, device=device).roll(start, dims=1)
        mask = (self.allowed[:, None, :end] & causal) | own  # [B, L, end]
        bias = torch.zeros(mask.shape, dtype=self.embed.dtype, device=device).masked_fill(
            ~mask, float("-inf")
        )
        grouped = bias[:, None, None].expand(rows, self.kv_heads, self.group, length, end)
        return grouped.reshape(rows * self.kv_heads, self.group * length, end)

    def __call__(self, input_ids: torch.Tensor, position_ids: torch.Tensor) -> torch.Tensor:
        rows, length = input_ids.shape
        start, end = self.filled, self.filled + length
        heads, kv, group, dim, total = self.heads, self.kv_heads, self.group, self.head_dim, self.total
        h = F.embedding(input_ids.reshape(-1), self.embed)  # [B*L, hidden]
        cos, sin = self.cos[position_ids][:, :, None], self.sin[position_ids][:, :, None]  # [B, L, 1, D]
        bias = self._bias(rows, length, start, end)
        for layer, keys, values in zip(self.layers, self.keys, self.values, strict=True):
            q, k, v = layer.qkv(h, rows, length, cos, sin)
            keys.view(rows, kv, dim, total)[..., start:end] = k.permute(0, 2, 3, 1)
            values.view(rows, kv, total, dim)[:, :, start:end] = v.transpose(1, 2)
            # the queries of one kv head side by side: [B*KV, G*L, D]
            qg = (
                q.reshape(rows, length, kv, group, dim)
                .permute(0, 2, 3, 1, 4)
                .reshape(rows * kv, group * length, dim)
            )
            scores = torch.baddbmm(bias, qg, keys[..., :end], alpha=self.scaling)
            o = torch.bmm(scores.softmax(dim=-1), values[:, :end])
            o = (
                o.view(rows, kv, group, length, dim)
                .permute(0, 3, 1, 2, 4)
                .reshape(rows * length, heads * dim)
            )
            h = layer.mlp(layer.attn_out(h, o))
        self.filled = end
        last = h.view(rows, length, -1)[:, -1]
        normed = _unit_rms(last, self.norm_eps_t) if self.fuse else _rms(last, self.norm_w, self.norm_eps)
        logits = F.linear(normed, self.lm_head)
        return logits if self.lm_head_lora is None else self.lm_head_lora.add(logits, normed)
