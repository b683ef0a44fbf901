"""The built-in rollout engine: an HTTP server answering the subset of SGLang's API that the
system uses, with SGLang 0.5.x field names, so the rollout and weight-sync code is the
same against this server and against `sglang.launch_server` on GPUs.

    python -m infra.engine_server.server --model-path DIR --host 127.0.0.1 --port P [--seed S]
        [--weight-update-session on|off] [--max-request-tokens N] [--max-request-mb MB]

`--weight-update-session on` (default) speaks SGLang >= 0.5.23: distributed weight updates
are refused outside `/begin_weight_update` ... `/end_weight_update`. `off` speaks SGLang
0.5.16, which has no such routes.

It binds loopback unless told otherwise, reads models from local paths only (the hub is
switched off), and with an API key (env PRL_ENGINE_API_KEY, SGLang's `--api-key` scheme:
`Authorization: Bearer <key>`) answers only requests that carry it. A request the model
cannot serve (too long, too many sequences, more prompt tokens than --max-request-tokens)
gets a 400 naming the field, and a body over --max-request-mb a 413 before it is parsed; a
client that hangs up cancels its generation; /health turns 503 when generation stops
making progress. A weight-group join whose master does not answer within the group
timeout fails with a 504 naming the master's address.

LoRA adapters (PEFT directories on the server's machine) load and unload by name
(`/load_lora_adapter`, `/unload_lora_adapter`), and /generate's `lora_path` names the
adapter each input runs with (`lora_registry` has SGLang's semantics).

SGLang's `update_weights_from_tensor` is deliberately absent: its payload is pickled, and
this server never unpickles anything that arrives over the network. Weights come by
broadcast over a weight-update group or from an HF directory on disk.
"""

from __future__ import annotations

import argparse
import os

import torch
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import ValidationError

from infra.engine_server import protocol as p
from infra.engine_server.engine_state import EngineState, GroupJoinTimeout
from infra.engine_server.generation_routes import Generation, add_generation_routes
from infra.engine_server.guards import BodyLimit, RequireKey
from infra.engine_server.lora_routes import add_lora_routes
from infra.engine_server.protocol import BadRequest
from infra.engine_server.status_routes import add_health_routes, add_info_routes
from infra.engine_server.weight_routes import (
    add_weight_memory_routes,
    add_weight_read_route,
    add_weight_update_routes,
)
from infra.heap import freeze_startup_heap
from infra.secrets import API_KEY_ENV


def create_app(
    state: EngineState,
    api_key: str | None = None,
    stall_s: float = 120.0,
    max_request_tokens: int = p.MAX_REQUEST_TOKENS,
    max_body_bytes: int | None = None,
) -> FastAPI:
    """The server's routes; `max_body_bytes` None: `protocol.default_body_limit`."""
    app = FastAPI(title="prefect-rl built-in engine")
    if api_key:
        app.add_middleware(RequireKey, api_key=api_key)
    # added last, so it runs first: an oversized body is refused before anything else
    app.add_middleware(BodyLimit, max_bytes=max_body_bytes or p.default_body_limit(max_request_tokens))
    _add_error_handlers(app)
    generation = Generation(state, max_request_tokens)
    add_generation_routes(app, generation)
    add_health_routes(app, generation, stall_s)
    add_weight_update_routes(app, state)
    add_weight_memory_routes(app, state)
    add_weight_read_route(app, state)
    add_lora_routes(app, state)
    add_info_routes(app, state)
    return app


def _add_error_handlers(app: FastAPI) -> None:
    """Every failure answers as SGLang's do: `success` false and a message saying why."""

    @app.exception_handler(RequestValidationError)
    @app.exception_handler(ValidationError)
    async def _invalid(_: Request, exc: RequestValidationError | ValidationError) -> JSONResponse:
        return p.failure(p.validation_message(exc))

    @app.exception_handler(BadRequest)
    async def _bad(_: Request, exc: BadRequest) -> JSONResponse:
        return p.failure(str(exc))

    @app.exception_handler(GroupJoinTimeout)
    async def _unreachable(_: Request, exc: GroupJoinTimeout) -> JSONResponse:
        return p.failure(str(exc), 504)

    @app.exception_handler(RuntimeError)
    async def _broken(_: Request, exc: RuntimeError) -> JSONResponse:
        # e.g. a weight-update group that timed out: the caller gets the reason, not a bare 500
        return p.failure(f"{type(exc).__name__}: {exc}", 500)

    @app.exception_handler(Exception)
    async def _unexpected(_: Request, exc: Exception) -> JSONResponse:
        return p.failure(f"internal error: {type(exc).__name__}: {exc}", 500)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model-path", required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=30000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--weight-version", default="0")
    parser.add_argument("--health-stall-s", type=float, default=120.0)
    parser.add_argument(
        "--group-timeout-s",
        type=float,
        default=120.0,
        help="how long a weight-update group join or broadcast waits for its peers",
    )
    parser.add_argument(
        "--max-request-tokens",
        type=int,
        default=p.MAX_REQUEST_TOKENS,
        help="prompt tokens (or text characters) one /generate may carry, all inputs together",
    )
    parser.add_argument(
        "--max-request-mb",
        type=float,
        default=None,
        help="largest request body, in MiB, refused with 413 before parsing; default: what "
        "--max-request-tokens and the sequence limit need (6 MiB for the default)",
    )
    parser.add_argument(
        "--weight-update-session",
        choices=["on", "off"],
        default="on",
        help="on: speak SGLang >= 0.5.23 (distributed updates only inside /begin_weight_update "
        "... /end_weight_update); off: speak SGLang 0.5.16 (no such routes)",
    )
    return parser


def main(argv: list[str] | None = None) -> None:
    import uvicorn

    args = _parser().parse_args(argv)
    # Models come from local paths only: a hub name must fail at once, never download.
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["TRANSFORMERS_OFFLINE"] = "1"
    torch.set_num_threads(args.threads)
    api_key = os.environ.pop(API_KEY_ENV, None)  # from the environment: argv is visible to `ps`
    state = EngineState(
        args.model_path,
        args.seed,
        args.weight_version,
        args.weight_update_session == "on",
        group_timeout_s=args.group_timeout_s,
    )
    max_body = int(args.max_request_mb * 2**20) if args.max_request_mb else None
    app = create_app(
        state,
        api_key=api_key,
        stall_s=args.health_stall_s,
        max_request_tokens=args.max_request_tokens,
        max_body_bytes=max_body,
    )
    freeze_startup_heap()  # the model and the imports: alive until the server stops
    try:
        # a short graceful shutdown: a request blocked in a collective must not hold SIGTERM up
        uvicorn.run(app, host=args.host, port=args.port, log_level="warning", timeout_graceful_shutdown=2)
    finally:
        state.offload.discard()  # a released model's copy on disk


if __name__ == "__main__":
    main()
