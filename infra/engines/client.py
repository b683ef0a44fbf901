"""A synchronous client of one rollout engine (the built-in server or SGLang), by HTTP.

Each EngineClient keeps one `httpx.Client` (a pool of kept-alive connections) for all its
calls until `close()`: a /health call on a new client and connection costs its caller
~0.6 ms of CPU, on a kept one ~0.35 ms (measured), and the manager probes every engine
each second while it generates, and a weight sync makes several calls per engine. The
pool is thread-safe: the trainer posts `update_weights_from_distributed` from a
background thread while it broadcasts, and the rollout manager generates from a thread
pool while it probes /health, each on a connection of its own. All clients share one TLS
context, made once: httpx would otherwise load the CA bundle for every client (~45 ms
each, measured).
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import ssl
from collections.abc import Iterator
from typing import Any

import httpx
import msgspec
import orjson

from infra.engines.completions import Completion, decode_completions
from infra.retry import poll
from infra.secrets import API_KEY_ENV

# The built-in engine's phase times of a weight update, JSON, beside SGLang's reply body.
TIMINGS_HEADER = "x-prl-timings"


def _headers() -> dict[str, str]:
    key = os.environ.get(API_KEY_ENV)
    return {"Authorization": f"Bearer {key}"} if key else {}


@functools.cache
def tls_context() -> ssl.SSLContext:
    return ssl.create_default_context()


# An idle connection is dropped after this long, under uvicorn's 5 s default (the built-in
# server and SGLang serve on uvicorn): a request never goes out on a connection the server
# is closing at that moment, which would fail it with no answer.
KEEPALIVE_S = 2.0
HEALTH_TIMEOUT_S = 5.0


class EngineError(RuntimeError):
    """An engine answered with an HTTP error or `success: false` (or did not answer)."""

    def __init__(self, message: str, status: int | None = None):
        super().__init__(message)
        self.status = status  # the HTTP status, None when the engine did not answer


class EngineClient:
    def __init__(self, url: str, timeout_s: float = 600):
        self.url = url.rstrip("/")
        self.timeout_s = timeout_s
        self._http = httpx.Client(
            timeout=timeout_s,
            verify=tls_context(),
            limits=httpx.Limits(
                max_connections=100, max_keepalive_connections=20, keepalive_expiry=KEEPALIVE_S
            ),
        )

    def close(self) -> None:
        """Close the kept-alive connections; the client is not used after it."""
        self._http.close()

    def __enter__(self) -> EngineClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _call(self, method: str, path: str, body: dict | None = None, timeout_s: float | None = None) -> Any:
        return self._exchange(method, path, body, timeout_s)[0]

    def _exchange(
        self, method: str, path: str, body: dict | None = None, timeout_s: float | None = None
    ) -> tuple[Any, httpx.Headers]:
        """The reply's decoded body and its headers; an EngineError for any failure."""
        resp = self._send(method, path, body, timeout_s)
        return reply_data(f"{self.url}{path}", resp.status_code, resp.content), resp.headers

    def _send(
        self, method: str, path: str, body: dict | None, timeout_s: float | None = None
    ) -> httpx.Response:
        try:
            return self._http.request(
                method,
                f"{self.url}{path}",
                content=request_content(body),
                headers=request_headers(body),
                timeout=timeout_s or self.timeout_s,
            )
        except httpx.HTTPError as exc:
            raise EngineError(f"{self.url}{path}: {type(exc).__name__}: {exc}") from exc

    def health(self) -> bool:
        try:
            return (
                self._http.get(f"{self.url}/health", headers=_headers(), timeout=HEALTH_TIMEOUT_S).status_code
                == 200
            )
        except httpx.HTTPError:
            return False

    def wait_healthy(self, timeout_s: float) -> None:
        if not poll(self.health, timeout_s, interval_s=0.2):
            raise EngineError(f"{self.url}: not healthy after {timeout_s} s")

    def generate(
        self,
        input_ids: list[list[int]],
        sampling_params: dict | list[dict],
        rid: str | list[str] | None = None,
        lora_path: str | list[str | None] | None = None,
    ) -> list[dict]:
        """One batch request; n>1 answers len(input_ids)*n dicts, input-major. Logprobs always on.

        `sampling_params` and `rid` may be one per input. A rid per input is the only way to
        abort one sample later: a single string is expanded by the server (`rid_0`, ...), and
        with n>1 SGLang gives every copy a fresh random rid. `lora_path`: the name of a loaded
        LoRA adapter (`load_lora_adapter`) for every input, or one name (None: the base
        weights) per input; absent from the body unless given.
        """
        out = self._call("POST", "/generate", _generate_body(input_ids, sampling_params, rid, lora_path))
        return out if isinstance(out, list) else [out]

    def sample(
        self,
        input_ids: list[list[int]],
        sampling_params: dict | list[dict],
        rid: str | list[str] | None = None,
        lora_path: str | list[str | None] | None = None,
    ) -> list[Completion]:
        """`generate` with the reply decoded into Completions (infra/engines/completions.py):
        the rollout manager's request, at about a third of the decoding cost."""
        where = f"{self.url}/generate"
        resp = self._send("POST", "/generate", _generate_body(input_ids, sampling_params, rid, lora_path))
        if resp.status_code >= 400:
            reply_data(where, resp.status_code, resp.content)  # raises, with the engine's message
        try:
            return decode_completions(resp.content)
        except msgspec.DecodeError as exc:
            reply_data(where, resp.status_code, resp.content)  # `success: false` raises here
            raise EngineError(f"{where}: not a /generate answer: {exc}", resp.status_code) from None

    def init_weights_update_group(
        self,
        master_address: str,
        master_port: int,
        rank_offset: int,
        world_size: int,
        group_name: str,
        backend: str = "gloo",
    ) -> None:
        body = {
            "master_address": master_address,
            "master_port": master_port,
            "rank_offset": rank_offset,
            "world_size": world_size,
            "group_name": group_name,
            "backend": backend,
        }
        self._call("POST", "/init_weights_update_group", body)

    def update_weights_from_distributed(
        self,
        names: list[str],
        dtypes: list[str],
        shapes: list[list[int]],
        group_name: str,
        flush_cache: bool = True,
        weight_version: str | None = None,
        load_format: str | None = None,
    ) -> dict:
        """Announce a bucket; its tensors then come by broadcast. `load_format="flattened_bucket"`:
        one byte buffer holding them back to back, in order. Returns the engine's own phase
        times where it reports them (the built-in engine does; SGLang does not: {})."""
        body = weights_update_body(
            names, dtypes, shapes, group_name, flush_cache, weight_version, load_format
        )
        _, headers = self._exchange("POST", "/update_weights_from_distributed", body)
        return timings_of(headers.get(TIMINGS_HEADER))

    def update_weights_from_disk(self, model_path: str, weight_version: str | None = None) -> None:
        self._call(
            "POST", "/update_weights_from_disk", {"model_path": model_path, "weight_version": weight_version}
        )

    def load_lora_adapter(self, lora_name: str, lora_path: str) -> dict:
        """Load the PEFT adapter directory `lora_path` (on the engine's machine) as `lora_name`;
        requests then name it in `lora_path`. Returns the loaded adapters, name -> path. A name
        already loaded is refused (400)."""
        body = {"lora_name": lora_name, "lora_path": lora_path}
        return self._call("POST", "/load_lora_adapter", body).get("loaded_adapters") or {}

    def unload_lora_adapter(self, lora_name: str) -> dict:
        """Unload an adapter once the requests using it have finished (the engine answers
        then); returns the adapters still loaded, name -> path."""
        body = {"lora_name": lora_name}
        return self._call("POST", "/unload_lora_adapter", body).get("loaded_adapters") or {}

    def destroy_weights_update_group(self, group_name: str) -> None:
        self._call("POST", "/destroy_weights_update_group", {"group_name": group_name})

    def get_weights_by_name(self, name: str, truncate_size: int = 100) -> list:
        """The parameter's first `truncate_size` rows as float32 values, as SGLang answers:
        a 2-D tensor gives a list of rows, a 1-D tensor a list of numbers."""
        return self._call("POST", "/get_weights_by_name", {"name": name, "truncate_size": truncate_size})

    def begin_weight_update(self) -> None:
        """Open an update session (SGLang >= 0.5.23 refuses updates outside one)."""
        self._call("POST", "/begin_weight_update", {})

    def end_weight_update(self) -> None:
        self._call("POST", "/end_weight_update", {})

    def release_memory_occupation(self, tags: list[str] | None = None) -> None:
        """Colocated mode: free the engine's weights/KV memory while the trainer runs."""
        self._call("POST", "/release_memory_occupation", {"tags": tags})

    def resume_memory_occupation(self, tags: list[str] | None = None) -> None:
        self._call("POST", "/resume_memory_occupation", {"tags": tags})

    def model_info(self) -> dict:
        """`/model_info`: model path, weight version (SGLang has no /get_weight_version route)."""
        return self._call("GET", "/model_info")

    def weight_version(self) -> str:
        return str(self.model_info()["weight_version"])

    def server_info(self) -> dict:
        """`/server_info`: the server's launch arguments (`dtype`, `tp_size`, ...)."""
        return self._call("GET", "/server_info")

    def flush_cache(self) -> None:
        self._call("POST", "/flush_cache")

    def pause_generation(self, mode: str = "abort") -> None:
        self._call("POST", "/pause_generation", {"mode": mode})

    def continue_generation(self) -> None:
        self._call("POST", "/continue_generation", {})

    def abort_request(self, rid: str = "", abort_all: bool = False) -> None:
        self._call("POST", "/abort_request", {"rid": rid, "abort_all": abort_all})


# How a weight update pauses an engine: running requests go back to the waiting queue and are
# recomputed after /continue_generation, so none is lost. SGLang's update routes take the
# model's writer lock unless the engine is paused, and running generations hold reader
# locks: an update issued during a long generation would wait for all of it ("abort"
# would lose the samples; "in_place" keeps the KV cache, so the update's flush fails).
PAUSE_MODE = "retract"


@contextlib.contextmanager
def paused(client: EngineClient) -> Iterator[None]:
    """Generation paused on this engine for the duration (resumed even on failure)."""
    client.pause_generation(PAUSE_MODE)
    try:
        yield
    finally:
        client.continue_generation()


def weights_update_body(
    names: list[str],
    dtypes: list[str],
    shapes: list[list[int]],
    group_name: str,
    flush_cache: bool = True,
    weight_version: str | None = None,
    load_format: str | None = None,
) -> dict:
    """The body of `/update_weights_from_distributed` (see `update_weights_from_distributed`)."""
    body = {
        "names": names,
        "dtypes": dtypes,
        "shapes": shapes,
        "group_name": group_name,
        "flush_cache": flush_cache,
        "weight_version": weight_version,
    }
    if load_format is not None:  # absent unless asked: older servers may not know the field
        body["load_format"] = load_format
    return body


def _generate_body(
    input_ids: list[list[int]],
    sampling_params: dict | list[dict],
    rid: str | list[str] | None,
    lora_path: str | list[str | None] | None,
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "input_ids": input_ids,
        "sampling_params": sampling_params,
        "return_logprob": True,
    }
    if rid is not None:
        body["rid"] = rid
    if lora_path is not None:
        body["lora_path"] = lora_path
    return body


def request_content(body: dict | None) -> bytes | None:
    # orjson writes a 1024-sample /generate body ~10x faster than the json httpx uses
    return None if body is None else orjson.dumps(body, option=orjson.OPT_SERIALIZE_NUMPY)


def request_headers(body: dict | None) -> dict[str, str]:
    return _headers() if body is None else {**_headers(), "Content-Type": "application/json"}


def reply_data(where: str, status: int, content: bytes) -> Any:
    """An engine's reply body, decoded; an EngineError (naming `where`, the URL and route) for
    an HTTP error or `success: false`."""
    try:
        # orjson: a /generate answer is mostly logprob floats, which it reads ~2x faster
        data = orjson.loads(content)
    except ValueError:  # orjson.JSONDecodeError included
        data = content.decode(errors="replace")
    if status >= 400 or (isinstance(data, dict) and data.get("success") is False):
        raise EngineError(f"{where}: HTTP {status}: {_message(data)}", status)
    return data


def timings_of(header: str | None) -> dict[str, float]:
    """Numeric fields of the timings header; {} when absent or malformed (they only inform)."""
    try:
        data = json.loads(header) if header else {}
    except ValueError:
        return {}
    if not isinstance(data, dict):
        return {}
    return {k: float(v) for k, v in data.items() if isinstance(v, (int, float))}


def _message(data: Any) -> str:
    if isinstance(data, dict):
        for key in ("message", "error_message", "error", "detail"):
            if key in data:
                value = data[key]
                return str(value.get("message", value) if isinstance(value, dict) else value)
    return str(data)[:2000]
