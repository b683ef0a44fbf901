"""SGLang 0.5.x's wire format as the built-in engine server speaks it: request bodies,
their decoding into prompts and stop ids, and the shape of /generate replies.

Unknown fields are rejected (HTTP 400 naming them) rather than ignored: a client written
for SGLang that asks for a setting this engine does not implement (say `min_p`) must
learn that its samples would differ, not get them silently.
"""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING, Annotated, Literal

from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from infra.model.tokenizer import describe_characters, unknown_characters

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from infra.engine_server.sampling import SampleOut


class BadRequest(ValueError):
    """A request the engine rejects (HTTP 400); the message names the offending field."""


def failure(message: str, status: int = 400) -> JSONResponse:
    """SGLang's reply to a request it could not carry out."""
    return JSONResponse({"success": False, "message": message}, status_code=status)


# Sequences one /generate may ask for (inputs x n): one batch holds them all in memory.
MAX_SEQUENCES = 4096
# Prompt tokens one /generate may carry, all inputs together (--max-request-tokens).
MAX_REQUEST_TOKENS = 2**19
# Bytes of a JSON request body per token of an input (a 6-digit id, comma and space), and
# per sequence for its sampling parameters and rid.
_BYTES_PER_TOKEN, _BYTES_PER_SEQUENCE = 8, 512


def default_body_limit(max_request_tokens: int) -> int:
    """The largest request body a request within the token and sequence limits can need
    (6 MiB for the default token limit); anything larger is refused unread (413)."""
    return max_request_tokens * _BYTES_PER_TOKEN + MAX_SEQUENCES * _BYTES_PER_SEQUENCE


# Long lists stop validating at their first bad item: one error, not one per item (a
# million bad ids would build a million error records while the event loop waits).
Ids = Annotated[list[int], Field(fail_fast=True)]


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class SamplingParams(_Body):
    max_new_tokens: int = Field(128, ge=0)
    temperature: float = Field(1.0, ge=0)
    top_p: float = Field(1.0, gt=0, le=1)
    top_k: int = Field(-1, ge=-1)
    stop_token_ids: Ids | None = None
    # single-token strings only: the engine matches tokens, not text
    stop: str | list[str] | None = None
    n: int = Field(1, ge=1, le=1024)
    ignore_eos: bool = False
    sampling_seed: int | None = Field(None, ge=0, le=2**63 - 1)
    # these two shape only `text`, as in SGLang
    skip_special_tokens: bool = True
    no_stop_trim: bool = False

    @field_validator("top_k")
    @classmethod
    def _top_k(cls, value: int) -> int:
        if value == 0:  # as SGLang: -1 turns top-k off, 0 would keep no token
            raise ValueError("must be -1 (all tokens) or at least 1")
        return value


class GenerateReq(_Body):
    text: str | Annotated[list[str], Field(fail_fast=True)] | None = None
    input_ids: Ids | Annotated[list[Ids], Field(fail_fast=True)] | None = None
    # one for all inputs, or one per input (as SGLang: then each may carry its own seed)
    sampling_params: SamplingParams | Annotated[list[SamplingParams], Field(fail_fast=True)] = Field(
        default_factory=SamplingParams
    )
    return_logprob: bool = False
    # accepted for compatibility; only response-token logprobs are returned
    logprob_start_len: int = -1
    rid: str | Annotated[list[str], Field(fail_fast=True)] | None = None
    stream: bool = False
    # the name of a loaded LoRA adapter for every input, or one per input (None: base weights)
    lora_path: str | Annotated[list[str | None], Field(fail_fast=True)] | None = None


class InitGroupReq(_Body):
    master_address: str
    master_port: int
    rank_offset: int
    world_size: int = Field(ge=2)
    group_name: str = "weight_update_group"
    backend: Literal["gloo", "nccl"] = "gloo"


class UpdateFromDistributedReq(_Body):
    names: Annotated[list[str], Field(fail_fast=True)]
    dtypes: Annotated[list[str], Field(fail_fast=True)]
    shapes: Annotated[list[Ids], Field(fail_fast=True)]
    group_name: str = "weight_update_group"
    flush_cache: bool = True
    weight_version: str | None = None
    # SGLang's two formats on this route: None, one broadcast per tensor in order of the
    # names; "flattened_bucket", one uint8 broadcast holding the tensors back to back
    load_format: Literal["flattened_bucket"] | None = None


class UpdateFromDiskReq(_Body):
    model_path: str
    load_format: str | None = None
    weight_version: str | None = None


class LoadLoraReq(_Body):
    lora_name: str
    lora_path: str
    # SGLang keeps a pinned adapter from eviction; this engine never evicts one
    pinned: bool = False


class UnloadLoraReq(_Body):
    lora_name: str


class GroupNameReq(_Body):
    group_name: str = "weight_update_group"


class PauseReq(_Body):
    # abort: in-flight requests end now with finish_reason abort. retract / in_place: they
    # run to completion (this engine cannot park a half-decoded batch); new ones wait.
    mode: Literal["abort", "retract", "in_place"] = "abort"


class AbortReq(_Body):
    rid: str = ""
    abort_all: bool = False


class MemoryOccupationReq(_Body):
    # SGLang's tags: "weights", "kv_cache", "cuda_graph"; None means all of them
    tags: list[Literal["weights", "kv_cache", "cuda_graph"]] | None = None


class WeightsByNameReq(_Body):
    name: str
    truncate_size: int = 100  # as SGLang: an int, never null


class BeginWeightUpdateReq(_Body):
    selector: Literal["target", "draft", "all"] = "all"


class EndWeightUpdateReq(_Body):
    pass


def _is_branch_tag(part: object) -> bool:
    # pydantic puts the union member it tried into the location (`SamplingParams`,
    # `list[SamplingParams]`); the user wrote field names only
    return isinstance(part, str) and (part[:1].isupper() or "[" in part)


def _ends_in_branch_tag(loc: tuple) -> bool:
    return bool(loc) and _is_branch_tag(loc[-1])  # a body that is not JSON has no location


# Errors a 400 lists at most: the first ones say what is wrong, a thousand more say nothing.
_ERRORS_SHOWN = 8


def validation_message(exc: RequestValidationError | ValidationError) -> str:
    errors = exc.errors()
    if any(not _ends_in_branch_tag(e["loc"]) for e in errors):
        # a value that failed inside the union branch it matched need not also hear that it
        # is not of the other branches' types
        errors = [e for e in errors if not _ends_in_branch_tag(e["loc"])]
    parts = []
    for err in errors:
        field = ".".join(str(x) for x in err["loc"] if x != "body" and not _is_branch_tag(x)) or "body"
        parts.append(f"{field}: {err['msg']}")
    parts = list(dict.fromkeys(parts))
    shown = "; ".join(parts[:_ERRORS_SHOWN])
    return shown if len(parts) <= _ERRORS_SHOWN else f"{shown}; and {len(parts) - _ERRORS_SHOWN} more"


def prompts_of(
    req: GenerateReq,
    tokenizer: PreTrainedTokenizerBase,
    vocab_size: int,
    max_tokens: int = MAX_REQUEST_TOKENS,
) -> tuple[list[list[int]], bool]:
    """The request's prompts as token ids, and whether it was a single (non-batch) input.
    At most `max_tokens` prompt tokens in all; text is refused by its length before it is
    tokenized (more than `max_tokens` characters), since tokenizing is the costly part."""
    if req.input_ids is not None:
        single = not req.input_ids or isinstance(req.input_ids[0], int)
        prompts = [req.input_ids] if single else req.input_ids
    elif req.text is not None:
        single = isinstance(req.text, str)
        texts = [req.text] if single else req.text
        chars = sum(len(t) for t in texts)
        if chars > max_tokens:
            raise BadRequest(f"text: {chars} characters exceed the request limit of {max_tokens}")
        prompts = [tokenizer.encode(t) for t in texts]
        unk = getattr(tokenizer, "unk_token_id", None)
        for text, prompt in zip(texts, prompts, strict=True):
            if unk is not None and unk in prompt:
                chars = describe_characters(unknown_characters(tokenizer, text))
                raise BadRequest(f"text: the model's tokenizer has no token for {chars}")
    else:
        raise BadRequest("input_ids: one of input_ids or text is required")
    total = sum(len(prompt) for prompt in prompts)
    if total > max_tokens:
        raise BadRequest(f"input_ids: {total} prompt tokens exceed the request limit of {max_tokens}")
    for prompt in prompts:
        if not prompt:
            raise BadRequest("input_ids: empty prompt")
        if not all(0 <= t < vocab_size for t in prompt):
            raise BadRequest(f"input_ids: token ids must lie in [0, {vocab_size})")
    return prompts, single


def check_limits(sp: SamplingParams, n: int, prompts: list[list[int]], max_positions: int | None) -> None:
    """Refuse a request the model cannot serve (rather than fail mid-decode with a 500, or
    decode for hours): every prompt plus max_new_tokens within the model's positions."""
    if len(prompts) * n > MAX_SEQUENCES:
        raise BadRequest(
            f"sampling_params.n: {len(prompts)} inputs x n={n} exceeds {MAX_SEQUENCES} sequences per request"
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


def sampling_params_of(req: GenerateReq, num_inputs: int) -> list[SamplingParams]:
    """One SamplingParams per input; a list must have one per input and share `n`."""
    sps = req.sampling_params
    if not isinstance(sps, list):
        return [sps] * num_inputs
    if len(sps) != num_inputs:
        raise BadRequest(f"sampling_params: {len(sps)} entries for {num_inputs} inputs")
    if len({sp.n for sp in sps}) > 1:
        raise BadRequest("sampling_params: n must be the same for all inputs")
    return sps


def rids_of(rid: str | list[str] | None, num_inputs: int, n: int, single: bool) -> list[str]:
    """The rid of every sampled sequence, input-major, as SGLang assigns them.

    A single input with n=1 keeps its rid. Otherwise a string rid becomes `rid_0`,
    `rid_1`, ... and a list must hold one rid per input. With n>1 SGLang then gives every
    copy a fresh random rid (the given ones are not reachable by /abort_request), so
    here too: per-sample rids need n=1 with each sample its own input.
    """
    if single and n == 1:
        return [rid if isinstance(rid, str) else uuid.uuid4().hex]
    if isinstance(rid, list):
        if len(rid) != num_inputs:
            raise BadRequest(f"rid: {len(rid)} rids for {num_inputs} inputs")
        if len(set(rid)) != len(rid):
            raise BadRequest("rid: duplicate request ids within the request")
    elif rid is not None and not isinstance(rid, str):
        raise BadRequest("rid: a string or a list of strings")
    if n > 1:
        return [uuid.uuid4().hex for _ in range(num_inputs * n)]
    if isinstance(rid, str):
        return [f"{rid}_{i}" for i in range(num_inputs)]
    return rid or [uuid.uuid4().hex for _ in range(num_inputs)]


def lora_names_of(req: GenerateReq, num_inputs: int) -> list[str | None]:
    """The LoRA adapter name of every input (None: the base weights); as SGLang, an empty
    string means no adapter."""
    names = req.lora_path
    if not names:
        return [None] * num_inputs
    if isinstance(names, str):
        return [names] * num_inputs
    if len(names) != num_inputs:
        raise BadRequest(f"lora_path: {len(names)} adapter names for {num_inputs} inputs")
    return names


def shared_params(sps: list[SamplingParams]) -> SamplingParams:
    """The settings of a batch, which this engine samples in one go: per-input parameters
    may differ in `sampling_seed` only."""
    # the fields' values (a model's __dict__) with the seed blanked: a model_dump per input
    # took ~3 ms for 1024 inputs
    first = {**vars(sps[0]), "sampling_seed": None}
    for sp in sps[1:]:
        if {**vars(sp), "sampling_seed": None} != first:
            raise BadRequest("sampling_params: per-input parameters may differ only in sampling_seed here")
    return sps[0]


def seeds_of(req: GenerateReq, sps: list[SamplingParams], n: int) -> int | list[int] | None:
    """A seed for the whole batch (one dict), one per sampled row (a list), or None.

    Per-input seeds seed one generator per row; the n copies of an input share its seed
    and so come out identical, as on SGLang with deterministic inference.
    """
    if not isinstance(req.sampling_params, list):
        return req.sampling_params.sampling_seed
    seeds = [sp.sampling_seed for sp in sps]
    if all(s is None for s in seeds):
        return None
    if any(s is None for s in seeds):
        raise BadRequest("sampling_params: sampling_seed must be set for every input or for none")
    return [s for s in seeds for _ in range(n)]


def stop_ids_of(sp: SamplingParams, tokenizer: PreTrainedTokenizerBase) -> set[int]:
    ids = set(sp.stop_token_ids or [])
    for s in [sp.stop] if isinstance(sp.stop, str) else sp.stop or []:
        encoded = tokenizer.encode(s, add_special_tokens=False)
        if len(encoded) != 1:
            raise BadRequest(f"sampling_params.stop: {s!r} is not a single token; use stop_token_ids")
        ids.add(encoded[0])
    return ids


def text_ids(out: SampleOut, sp: SamplingParams) -> list[int]:
    """The ids a reply's text is decoded from: as SGLang, a matched stop token stays in
    output_ids but is trimmed from the text."""
    if out.finish_reason["type"] == "stop" and not sp.no_stop_trim:
        return out.output_ids[:-1]
    return out.output_ids


def reply(out: SampleOut, text: str, prompt_len: int, rid: str, version: str, req: GenerateReq) -> dict:
    """One SGLang /generate answer for one sampled sequence (`text`: its `text_ids` decoded)."""
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
    return {"text": text, "output_ids": out.output_ids, "meta_info": meta}
