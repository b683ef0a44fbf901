"""SGLang 0.5.x's wire format as the built-in engine server speaks it: request bodies,
their decoding into prompts and stop ids, and the shape of /generate replies.

Unknown fields are rejected (HTTP 400 naming them) rather than ignored: a client written
for SGLang that asks for a setting this engine does not implement (say `min_p`) must
learn that its samples would differ, not get them silently.
"""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING, Literal

from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ConfigDict, Field, ValidationError

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from infra.rollout.sampling import SampleOut


class BadRequest(ValueError):
    """A request the engine rejects (HTTP 400); the message names the offending field."""


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class SamplingParams(_Body):
    max_new_tokens: int = Field(128, ge=0)
    temperature: float = Field(1.0, ge=0)
    top_p: float = Field(1.0, gt=0, le=1)
    top_k: int = -1
    stop_token_ids: list[int] | None = None
    # single-token strings only: the engine matches tokens, not text
    stop: str | list[str] | None = None
    n: int = Field(1, ge=1, le=1024)
    ignore_eos: bool = False
    sampling_seed: int | None = Field(None, ge=0, le=2**63 - 1)
    # these two shape only `text`, as in SGLang
    skip_special_tokens: bool = True
    no_stop_trim: bool = False


class GenerateReq(_Body):
    text: str | list[str] | None = None
    input_ids: list[int] | list[list[int]] | None = None
    sampling_params: SamplingParams = Field(default_factory=SamplingParams)
    return_logprob: bool = False
    # accepted for compatibility; only response-token logprobs are returned
    logprob_start_len: int = -1
    rid: str | list[str] | None = None
    stream: bool = False


class InitGroupReq(_Body):
    master_address: str
    master_port: int
    rank_offset: int
    world_size: int = Field(ge=2)
    group_name: str = "weight_update_group"
    backend: Literal["gloo", "nccl"] = "gloo"


class UpdateFromDistributedReq(_Body):
    names: list[str]
    dtypes: list[str]
    shapes: list[list[int]]
    group_name: str = "weight_update_group"
    flush_cache: bool = True
    weight_version: str | None = None


class UpdateFromDiskReq(_Body):
    model_path: str
    load_format: str | None = None
    weight_version: str | None = None


class GroupNameReq(_Body):
    group_name: str = "weight_update_group"


class PauseReq(_Body):
    # abort: in-flight requests end now with finish_reason abort. retract / in_place: they
    # run to completion (this engine cannot park a half-decoded batch); new ones wait.
    mode: Literal["abort", "retract", "in_place"] = "abort"


class AbortReq(_Body):
    rid: str = ""
    abort_all: bool = False


class WeightsByNameReq(_Body):
    name: str
    truncate_size: int | None = 100


def validation_message(exc: RequestValidationError | ValidationError) -> str:
    parts = []
    for err in exc.errors():
        field = ".".join(str(x) for x in err["loc"] if x != "body") or "body"
        parts.append(f"{field}: {err['msg']}")
    return "; ".join(parts)


def prompts_of(
    req: GenerateReq, tokenizer: PreTrainedTokenizerBase, vocab_size: int
) -> tuple[list[list[int]], bool]:
    """The request's prompts as token ids, and whether it was a single (non-batch) input."""
    if req.input_ids is not None:
        single = not req.input_ids or isinstance(req.input_ids[0], int)
        prompts = [req.input_ids] if single else req.input_ids
    elif req.text is not None:
        single = isinstance(req.text, str)
        texts = [req.text] if single else req.text
        prompts = [tokenizer.encode(t) for t in texts]
    else:
        raise BadRequest("input_ids: one of input_ids or text is required")
    for prompt in prompts:
        if not prompt:
            raise BadRequest("input_ids: empty prompt")
        if not all(0 <= t < vocab_size for t in prompt):
            raise BadRequest(f"input_ids: token ids must lie in [0, {vocab_size})")
    return prompts, single


# Sequences one /generate may ask for (inputs x n): one batch holds them all in memory.
MAX_SEQUENCES = 4096


def check_limits(req: GenerateReq, prompts: list[list[int]], max_positions: int | None) -> None:
    """Refuse a request the model cannot serve (rather than fail mid-decode with a 500, or
    decode for hours): every prompt plus max_new_tokens within the model's positions."""
    sp = req.sampling_params
    if len(prompts) * sp.n > MAX_SEQUENCES:
        raise BadRequest(
            f"sampling_params.n: {len(prompts)} inputs x n={sp.n} exceeds {MAX_SEQUENCES} sequences per request"
        )
    if max_positions is None:
        return
    longest = max(len(p) for p in prompts)
    if longest >= max_positions:
        raise BadRequest(
            f"input_ids: a prompt of {longest} tokens fills the model's {max_positions} positions"
        )
    if longest + sp.max_new_tokens > max_positions:
        raise BadRequest(
            f"sampling_params.max_new_tokens: {sp.max_new_tokens} new tokens after a prompt of {longest} "
            f"exceed the model's {max_positions} positions"
        )


def rids_of(rid: str | list[str] | None, num_inputs: int) -> list[str]:
    if rid is None:
        return [uuid.uuid4().hex] * num_inputs
    if isinstance(rid, str):
        return [rid] * num_inputs
    if len(rid) != num_inputs:
        raise BadRequest(f"rid: {len(rid)} rids for {num_inputs} inputs")
    return rid


def stop_ids_of(sp: SamplingParams, tokenizer: PreTrainedTokenizerBase) -> set[int]:
    ids = set(sp.stop_token_ids or [])
    for s in [sp.stop] if isinstance(sp.stop, str) else sp.stop or []:
        encoded = tokenizer.encode(s, add_special_tokens=False)
        if len(encoded) != 1:
            raise BadRequest(f"sampling_params.stop: {s!r} is not a single token; use stop_token_ids")
        ids.add(encoded[0])
    return ids


def reply(
    out: SampleOut,
    prompt_len: int,
    rid: str,
    version: str,
    req: GenerateReq,
    tokenizer: PreTrainedTokenizerBase,
) -> dict:
    """One SGLang /generate answer for one sampled sequence."""
    sp = req.sampling_params
    text_ids = out.output_ids
    # As SGLang: the matched stop token stays in output_ids but is trimmed from the text.
    if out.finish_reason["type"] == "stop" and not sp.no_stop_trim:
        text_ids = text_ids[:-1]
    meta = {
        "id": rid,
        "finish_reason": out.finish_reason,
        "prompt_tokens": prompt_len,
        "completion_tokens": len(out.output_ids),
        "cached_tokens": 0,
        "weight_version": version,
    }
    if req.return_logprob:
        meta["output_token_logprobs"] = [
            [lp, t, None] for lp, t in zip(out.logprobs, out.output_ids, strict=True)
        ]
    text = tokenizer.decode(text_ids, skip_special_tokens=sp.skip_special_tokens)
    return {"text": text, "output_ids": out.output_ids, "meta_info": meta}
