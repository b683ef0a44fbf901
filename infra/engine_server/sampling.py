"""Batched, KV-cached sampling with an HF causal LM: the built-in engine's decode loop.

All sequences of one request run as one batch: prompts are left-padded (so every row's
next token sits in the last column), prefilled once, then decoded one token per step
while the KV cache grows. Finished rows keep being fed tokens (their outputs are
ignored) so the batch keeps its shape; rows never attend to each other, so this cannot
change the live rows.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import torch
from transformers import DynamicCache

from infra.engine_server import lean_llama
from infra.engine_server.lean_llama import LeanLlamaDecoder
from infra.engine_server.lora_apply import hooked

if TYPE_CHECKING:
    from infra.engine_server.lora_adapters import LoraAdapter

# Below this temperature sampling is greedy (as in SGLang) and logprobs are taken at T=1,
# since dividing by ~0 would turn them into 0/-inf.
GREEDY_TEMPERATURE = 1e-5


# SplitMix64's increment and output mix (Steele, Lea and Flood, "Fast splittable
# pseudorandom number generators", 2014; Java's SplittableRandom)
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MIX1, _MIX2 = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)


@dataclass(frozen=True)
class RowSeeds:
    """One sampling seed per row: a row's draws depend on its own seed only, not on its
    batch. Draw t of a row is output t of SplitMix64 seeded with the row's seed, computed
    for every row and step at once in numpy: a torch generator per row cost ~8 us a row to
    make and draw from (~8 ms for a 1024-row request, as much as its one-token prefill),
    and neither torch nor numpy draws from many seeds in one call."""

    seeds: list[int]

    def __len__(self) -> int:
        return len(self.seeds)

    def subset(self, rows: list[int]) -> RowSeeds:
        return RowSeeds([self.seeds[i] for i in rows])

    def uniforms(self, steps: int) -> torch.Tensor:
        """Every row's draws in [0, 1), [step, row], float64 (53 random bits each)."""
        state = np.array([seed % 2**64 for seed in self.seeds], dtype=np.uint64)
        z = state[None, :] + np.arange(1, steps + 1, dtype=np.uint64)[:, None] * _GOLDEN
        z = (z ^ (z >> np.uint64(30))) * _MIX1
        z = (z ^ (z >> np.uint64(27))) * _MIX2
        z ^= z >> np.uint64(31)
        return torch.from_numpy((z >> np.uint64(11)).astype(np.float64) * 2.0**-53)


@dataclass
class SampleOut:
    output_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    # SGLang's meta_info.finish_reason: {"type": "stop", "matched": id} | {"type": "length",
    # "length": n} | {"type": "abort"}
    finish_reason: dict | None = None


def _cache_kwarg(model: torch.nn.Module) -> str:
    # transformers 5.x renamed `past_key_values` to `cache` (the old name is deprecated and
    # slated for removal); follow whichever name this version's forward takes.
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def _filter_top_k_top_p(logits: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """Mask (to -inf) the tokens outside top-k and outside the top-p nucleus, per row."""
    if 0 < top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        probs = torch.softmax(sorted_logits, dim=-1)
        # drop a token when the mass strictly before it already reaches top_p; the most
        # likely token always survives
        drop_sorted = (probs.cumsum(dim=-1) - probs) > top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits


def _draw(
    probs: torch.Tensor, generator: torch.Generator | None, uniforms: torch.Tensor | None
) -> torch.Tensor:
    if uniforms is None:
        return torch.multinomial(probs, 1, generator=generator).flatten()
    # one uniform per row from the row's own seed, then the inverse CDF: ~4x faster
    # than a multinomial call per row. Normalised by its last entry the CDF ends at exactly
    # 1, and `right=True` never lands on a zero-probability token.
    cdf = probs.double().cumsum(dim=-1)
    cdf = cdf / cdf[:, -1:]
    return torch.searchsorted(cdf, uniforms[:, None], right=True).flatten().clamp(max=probs.shape[-1] - 1)


class _HFDecoder:
    """transformers' own forward with a DynamicCache (any causal LM)."""

    def __init__(self, model: torch.nn.Module, prompt_mask: torch.Tensor) -> None:
        self.model, self.mask = model, prompt_mask
        self.cache = DynamicCache(config=model.config)
        self.cache_kw = _cache_kwarg(model)
        self.started = False

    def __call__(self, input_ids: torch.Tensor, position_ids: torch.Tensor) -> torch.Tensor:
        if self.started:  # the previous step's token joins the context
            self.mask = torch.cat([self.mask, torch.ones_like(self.mask[:, :1])], dim=-1)
        self.started = True
        out = self.model(
            input_ids=input_ids,
            attention_mask=self.mask,
            position_ids=position_ids,
            use_cache=True,
            logits_to_keep=1,
            **{self.cache_kw: self.cache},
        )
        return out.logits[:, -1, :]


class _SharedPrefill:
    """Prefills each distinct prompt once, then decodes every row: the n samples of one
    prompt (a GRPO group) share its prompt's cache, as in SGLang's prefix cache. The
    prompt's forward is most of the work when responses are short."""

    def __init__(
        self, decoder: LeanLlamaDecoder, first: torch.Tensor, index: torch.Tensor, decodes: bool
    ) -> None:
        # first[u]: a row holding distinct prompt u; index[row]: the distinct prompt of the row;
        # decodes: steps follow the prefill (else the copies never need a cache of their own)
        self.decoder, self.first, self.index, self.decodes = decoder, first, index, decodes
        self.prefilled = False

    def __call__(self, input_ids: torch.Tensor, position_ids: torch.Tensor) -> torch.Tensor:
        if self.prefilled:
            return self.decoder(input_ids, position_ids)
        self.prefilled = True
        logits = self.decoder(input_ids[self.first], position_ids[self.first])
        if self.decodes:
            self.decoder.expand(self.index)
        return logits[self.index]


def _distinct(prompts: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(first row of each distinct prompt, each row's distinct prompt); None when all differ."""
    seen: dict[tuple[int, ...], int] = {}
    index = [seen.setdefault(tuple(prompt), len(seen)) for prompt in prompts]
    if len(seen) == len(prompts):
        return None
    first = [0] * len(seen)
    for row in reversed(range(len(prompts))):
        first[index[row]] = row
    return torch.tensor(first), torch.tensor(index)


def _lean_decoder(
    model: torch.nn.Module,
    prompts: list[list[int]],
    mask: torch.Tensor,
    max_new_tokens: int,
    lora: LoraAdapter | None,
) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    shared = _distinct(prompts)
    if shared is None:
        return LeanLlamaDecoder(model, mask, max_new_tokens, lora=lora)
    first, index = shared
    decoder = LeanLlamaDecoder(model, mask[first.to(mask.device)], max_new_tokens, lora=lora)
    return _SharedPrefill(decoder, first.to(mask.device), index.to(mask.device), max_new_tokens > 1)


def _left_pad(prompts: list[list[int]], pad_id: int, device: torch.device):
    width = max(len(p) for p in prompts)
    # rows built as lists, one tensor each: a tensor op per row cost more than the prefill
    # of a batch of short prompts
    ids = torch.tensor(
        [[pad_id] * (width - len(p)) + list(p) for p in prompts], dtype=torch.long, device=device
    )
    mask = torch.tensor(
        [[0] * (width - len(p)) + [1] * len(p) for p in prompts], dtype=torch.long, device=device
    )
    # positions count real tokens only, so a padded row sees the same RoPE positions as
    # the same prompt alone; pad columns get 0 (they are masked anyway)
    positions = (mask.cumsum(dim=-1) - 1).clamp(min=0)
    return ids, mask, positions


class _Sampler:
    """Each step's token of every row from the step's logits, with its logprob."""

    def __init__(
        self,
        temperature: float,
        top_k: int,
        top_p: float,
        generator: torch.Generator | RowSeeds | None,
        steps: int,
        device: torch.device,
    ) -> None:
        self.temperature, self.top_k, self.top_p, self.device = temperature, top_k, top_p, device
        self.greedy = temperature < GREEDY_TEMPERATURE
        per_row = isinstance(generator, RowSeeds)
        self.generator = None if per_row else generator
        # a row's draws come from its own seed only, all of them up front; [step, row], so a
        # step's draws are contiguous
        self.uniforms = generator.uniforms(steps) if per_row and not self.greedy else None

    def __call__(self, logits: torch.Tensor, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The step's tokens, and the log-softmax they are drawn from (every token's)."""
        # The logprob is that of the unprocessed policy at the sampling temperature, not of
        # the top-k/top-p-truncated distribution: the trainer recomputes logprobs from the
        # plain model at this temperature, and the two must describe the same distribution
        # for importance ratios (and train/inference mismatch checks) to make sense.
        scaled = logits if self.greedy or self.temperature == 1.0 else logits / self.temperature
        logprobs = torch.log_softmax(scaled, dim=-1)
        if self.greedy:
            return scaled.argmax(dim=-1), logprobs
        probs = torch.softmax(_filter_top_k_top_p(scaled, self.top_k, self.top_p), dim=-1)
        row_draws = None if self.uniforms is None else self.uniforms[step]
        return _draw(probs.cpu(), self.generator, row_draws).to(self.device), logprobs


class _Outputs:
    """Every row's token and logprob of every step, and how and when each row ended.

    The tokens and logprobs go into two tensors, read out once at the end; per step only
    the rows that end are handled in Python. A row's output is its first `lengths[row]`
    steps."""

    def __init__(self, rows: int, steps: int, device: torch.device) -> None:
        self.ids = torch.empty(steps, rows, dtype=torch.long, device=device)
        self.logprobs = torch.empty(steps, rows, dtype=torch.float32, device=device)
        self.lengths = [steps] * rows
        # a row that meets no stop token and is not aborted ends by length
        self.reasons: list[dict] = [{"type": "length", "length": steps} for _ in range(rows)]
        self.live = torch.ones(rows, dtype=torch.bool, device=device)
        self.steps = 0  # steps recorded

    def abort(self, flags: list[bool], step: int) -> bool:
        """End the flagged rows before `step`; True when no row is left."""
        if not any(flags):
            return False
        for row, aborted in enumerate(flags):
            if aborted and self.reasons[row]["type"] == "length":  # not ended yet
                self.reasons[row] = {"type": "abort"}
                self.lengths[row] = step
                self.live[row] = False
        return not self.live.any()

    def record(self, step: int, tokens: torch.Tensor, logprobs: torch.Tensor) -> None:
        self.ids[step] = tokens
        self.logprobs[step] = logprobs.gather(-1, tokens[:, None]).flatten()
        self.steps = step + 1

    def stop(self, step: int, tokens: torch.Tensor, stop_ids: torch.Tensor) -> bool:
        """End the live rows whose `step` token is a stop token; True when no row is left."""
        ended = torch.isin(tokens, stop_ids) & self.live
        if not ended.any():
            return False
        for row in ended.nonzero().flatten().tolist():
            self.reasons[row] = {"type": "stop", "matched": int(tokens[row])}
            self.lengths[row] = step + 1
        self.live &= ~ended
        return not self.live.any()

    def samples(self) -> list[SampleOut]:
        ids = self.ids[: self.steps].t().tolist()
        logprobs = self.logprobs[: self.steps].t().tolist()
        return [
            SampleOut(output_ids=ids[row][:n], logprobs=logprobs[row][:n], finish_reason=self.reasons[row])
            for row, n in enumerate(self.lengths)
        ]


@torch.inference_mode()
def sample_batch(
    model: torch.nn.Module,
    prompts: list[list[int]],
    *,
    max_new_tokens: int,
    temperature: float = 1.0,
    top_p: float = 1.0,
    top_k: int = -1,
    stop_token_ids: set[int] | frozenset[int] = frozenset(),
    eos_token_id: int | None = None,
    ignore_eos: bool = False,
    generator: torch.Generator | RowSeeds | None = None,
    should_abort: Callable[[], list[bool]] | None = None,
    lora: LoraAdapter | None = None,
) -> list[SampleOut]:
    """Sample a continuation of every prompt in one batch; deterministic given `generator`.

    The token that ends a sequence (a stop token, or eos unless `ignore_eos`) is included
    in its `output_ids` and `logprobs`, as SGLang does for `stop_token_ids`. `generator`
    is a CPU generator (the draw happens on CPU so a seed means the same on any device), or
    a seed per row (`RowSeeds`): then a row's tokens depend on its own seed only, not on its
    batch.
    `should_abort` answers one flag per row; a flagged row ends with finish_reason abort.
    `lora`: the LoRA adapter every row runs with (None: the base weights).
    """
    if isinstance(generator, RowSeeds) and len(generator) != len(prompts):
        raise ValueError(f"generator: {len(generator)} seeds for {len(prompts)} prompts")
    if not prompts or any(len(p) == 0 for p in prompts):
        raise ValueError("prompts: every prompt needs at least one token")
    device = next(model.parameters()).device
    stops = set(stop_token_ids)
    if eos_token_id is not None and not ignore_eos:
        stops.add(eos_token_id)
    stop_ids = torch.tensor(sorted(stops), dtype=torch.long, device=device) if stops else None
    ids, mask, positions = _left_pad(prompts, eos_token_id if eos_token_id is not None else 0, device)
    lean = lean_llama.supports(model)
    decode = _lean_decoder(model, prompts, mask, max_new_tokens, lora) if lean else _HFDecoder(model, mask)
    sample = _Sampler(temperature, top_k, top_p, generator, max_new_tokens, device)
    out = _Outputs(len(prompts), max_new_tokens, device)
    # transformers' forward gets the adapter through hooks on its layers, for this batch only
    with hooked(model, None if lean or lora is None else lora.modules):
        _decode_loop(decode, sample, out, ids, positions, stop_ids, should_abort, max_new_tokens)
    return out.samples()


def _decode_loop(
    decode: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    sample: _Sampler,
    out: _Outputs,
    ids: torch.Tensor,
    positions: torch.Tensor,
    stop_ids: torch.Tensor | None,
    should_abort: Callable[[], list[bool]] | None,
    max_new_tokens: int,
) -> None:
    """Prefill, then one token per step into `out`, until every row ended or the last step."""
    device = ids.device
    # the position of every step's token, per row (one column per step)
    next_positions = positions[:, -1:] + torch.arange(1, max_new_tokens + 1, device=device)
    step_ids, step_positions = ids, positions
    for step in range(max_new_tokens):
        if should_abort is not None and out.abort(should_abort(), step):
            break
        tokens, logprobs = sample(decode(step_ids, step_positions).float(), step)
        out.record(step, tokens, logprobs)
        if stop_ids is not None and out.stop(step, tokens, stop_ids):
            break
        # finished rows go on with whatever they drew (their outputs are ignored); rows
        # never attend to each other, so this cannot change the live rows
        step_ids = tokens[:, None]
        step_positions = next_positions[:, step : step + 1]
