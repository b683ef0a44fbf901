"""The built-in rollout engine: an HTTP server answering the subset of SGLang's API that the
system uses, with SGLang 0.5.x field names, so the rollout and weight-sync code is the
same against this server and against `sglang.launch_server` on GPUs.

    python -m infra.rollout.server --model-path DIR --host 127.0.0.1 --port P [--seed S]
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

SGLang's `update_weights_from_tensor` is deliberately absent: its payload is pickled, and
this server never unpickles anything that arrives over the network. Weights come by
broadcast over a weight-update group or from an HF directory on disk.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import os
import threading
from concurrent.futures import ThreadPoolExecutor

import orjson
import torch
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import ValidationError

from infra.rollout import protocol as p
from infra.rollout.client import API_KEY_ENV, TIMINGS_HEADER
from infra.rollout.engine_state import EngineState, GroupJoinTimeout
from infra.rollout.guards import BeatingFlag, BodyLimit, Progress, RequireKey
from infra.rollout.protocol import BadRequest


def _fail(message: str, status: int = 400) -> JSONResponse:
    return JSONResponse({"success": False, "message": message}, status_code=status)


def create_app(
    state: EngineState,
    api_key: str | None = None,
    stall_s: float = 120.0,
    max_request_tokens: int = p.MAX_REQUEST_TOKENS,
    max_body_bytes: int | None = None,
) -> FastAPI:
    """The server's routes; `max_body_bytes` None: `protocol.default_body_limit`."""
    app = FastAPI(title="prefect-rl built-in engine")
    running = asyncio.Event()  # cleared by /pause_generation: new requests wait
    running.set()
    # Generation has its own threads, and so do weight-group joins: a join blocked on an
    # absent peer holds its thread for up to the group timeout, and a dozen of them must
    # starve neither generation nor the other routes (which use the default pool).
    gen_pool = ThreadPoolExecutor(4, thread_name_prefix="generate")
    join_pool = ThreadPoolExecutor(4, thread_name_prefix="group-join")
    progress = Progress()
    max_positions = getattr(state.model.config, "max_position_embeddings", None)

    async def _generate_in_pool(batch, params, seed, flags: list[threading.Event], request: Request | None):
        with progress.lock:
            if not progress.active:
                progress.beat()
            progress.active += 1
        try:
            beating = [BeatingFlag(flag, progress) for flag in flags]
            call = functools.partial(state.generate, batch, params, seed, beating)
            task = asyncio.get_running_loop().run_in_executor(gen_pool, call)
            while True:
                done, _ = await asyncio.wait({task}, timeout=0.25)
                if done:
                    return task.result()
                if request is not None and await request.is_disconnected():
                    for flag in flags:  # the client is gone: the decode loop ends at its next step
                        flag.set()
        finally:
            with progress.lock:
                progress.active -= 1
                progress.beat()

    if api_key:
        app.add_middleware(RequireKey, api_key=api_key)
    # added last, so it runs first: an oversized body is refused before anything else
    app.add_middleware(BodyLimit, max_bytes=max_body_bytes or p.default_body_limit(max_request_tokens))

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        return _fail(p.validation_message(exc))

    @app.exception_handler(BadRequest)
    async def _bad(_: Request, exc: BadRequest) -> JSONResponse:
        return _fail(str(exc))

    @app.exception_handler(GroupJoinTimeout)
    async def _unreachable(_: Request, exc: GroupJoinTimeout) -> JSONResponse:
        return _fail(str(exc), 504)

    @app.exception_handler(RuntimeError)
    async def _broken(_: Request, exc: RuntimeError) -> JSONResponse:
        # e.g. a weight-update group that timed out: the caller gets the reason, not a bare 500
        return JSONResponse({"success": False, "message": f"{type(exc).__name__}: {exc}"}, status_code=500)

    @app.exception_handler(Exception)
    async def _unexpected(_: Request, exc: Exception) -> JSONResponse:
        return _fail(f"internal error: {type(exc).__name__}: {exc}", 500)

    @app.post("/generate")
    async def generate(req: p.GenerateReq, request: Request):
        if req.stream:
            raise BadRequest("stream: streaming is not supported by the built-in engine")
        # tokenizing long text takes a while: off the event loop (/health answers there), in
        # generation's own threads (hung group joins may hold all of the default ones)
        prompts, single = await asyncio.get_running_loop().run_in_executor(
            gen_pool, p.prompts_of, req, state.tokenizer, state.model.config.vocab_size, max_request_tokens
        )
        sps = p.sampling_params_of(req, len(prompts))
        sp, n = p.shared_params(sps), sps[0].n
        p.check_limits(sp, n, prompts, max_positions)
        rids = p.rids_of(req.rid, len(prompts), n, single)
        params = {
            "max_new_tokens": sp.max_new_tokens,
            "temperature": sp.temperature,
            "top_p": sp.top_p,
            "top_k": sp.top_k,
            "stop_token_ids": p.stop_ids_of(sp, state.tokenizer),
            "ignore_eos": sp.ignore_eos,
        }
        # n samples of each input, input-major as SGLang orders them; all in one batch
        rows = [(prompt, isp) for prompt, isp in zip(prompts, sps, strict=True) for _ in range(n)]
        seeds = p.seeds_of(req, sps, n)
        flags = state.register(rids)
        try:
            await running.wait()
            batch = [prompt for prompt, _ in rows]
            outs, version = await _generate_in_pool(batch, params, seeds, flags, request)
        finally:
            state.unregister(rids, flags)
        replies = [
            p.reply(o, len(pr), rid, version, req, isp, state.tokenizer)
            for o, (pr, isp), rid in zip(outs, rows, rids, strict=True)
        ]
        # plain JSON types already: skip FastAPI's per-item encoder walk (~1 ms per 100 tokens),
        # and write them with orjson, ~20x faster than the json module on the logprob floats
        # (the same shortest round-trip text for every float)
        return Response(
            orjson.dumps(replies[0] if single and n == 1 else replies), media_type="application/json"
        )

    @app.post("/init_weights_update_group")
    async def init_group(req: p.InitGroupReq):
        args = (
            req.group_name,
            req.master_address,
            req.master_port,
            req.rank_offset,
            req.world_size,
            req.backend,
        )
        await asyncio.get_running_loop().run_in_executor(join_pool, state.open_group, *args)
        return {"success": True, "message": f"joined group {req.group_name!r} as rank {req.rank_offset}"}

    if state.session:
        # SGLang >= 0.5.23: distributed updates only between these two calls. Without the
        # switch the routes do not exist (404), as on SGLang 0.5.16.
        @app.post("/begin_weight_update")
        async def begin_update(req: p.BeginWeightUpdateReq):
            error = state.begin_update()
            return _fail(error) if error else {"success": True, "message": "Success"}

        @app.post("/end_weight_update")
        async def end_update(req: p.EndWeightUpdateReq):
            error = state.end_update()
            return _fail(error) if error else {"success": True, "message": "Success"}

    @app.post("/update_weights_from_distributed")
    async def update_distributed(req: p.UpdateFromDistributedReq):
        args = (req.names, req.dtypes, req.shapes, req.group_name, req.weight_version, req.load_format)
        timings: dict[str, float] = {}
        error = await asyncio.to_thread(state.update_from_distributed, *args, timings=timings)
        if error:
            return _fail(error)
        # the body is exactly SGLang's; this engine's own phase times ride in a header
        body = {"success": True, "message": f"updated {len(req.names)} tensors"}
        return JSONResponse(body, headers={TIMINGS_HEADER: json.dumps(timings)})

    @app.post("/update_weights_from_disk")
    async def update_disk(req: p.UpdateFromDiskReq):
        error = await asyncio.to_thread(state.update_from_disk, req.model_path, req.weight_version)
        return _fail(error) if error else {"success": True, "message": f"loaded {req.model_path}"}

    @app.post("/destroy_weights_update_group")
    async def destroy_group(req: p.GroupNameReq):
        state.close_group(req.group_name)
        return {"success": True, "message": f"destroyed group {req.group_name!r}"}

    @app.api_route("/flush_cache", methods=["GET", "POST"])
    async def flush_cache():
        return {"success": True, "message": "no prefix cache: nothing to flush"}

    @app.post("/pause_generation")
    async def pause(req: p.PauseReq):
        running.clear()
        if req.mode == "abort":
            state.abort(abort_all=True)
        return {"success": True, "message": f"paused ({req.mode})"}

    @app.post("/continue_generation")
    async def resume():
        running.set()
        return {"success": True, "message": "continued"}

    @app.post("/abort_request")
    async def abort(req: p.AbortReq):
        state.abort(req.rid, req.abort_all)
        return {"success": True, "message": "aborted"}

    @app.post("/release_memory_occupation")
    async def release_memory(req: p.MemoryOccupationReq):
        freed = await asyncio.to_thread(state.release_memory, req.tags)
        return {"success": True, "message": f"released {freed} bytes of weights"}

    @app.post("/resume_memory_occupation")
    async def resume_memory(req: p.MemoryOccupationReq):
        await asyncio.to_thread(state.resume_memory, req.tags)
        return {"success": True, "message": "resumed"}

    @app.get("/health")
    async def health():
        stalled = progress.stalled_for()
        if stalled > stall_s:
            return JSONResponse(
                {"status": "stalled", "message": f"no generation progress for {stalled:.0f} s"},
                status_code=503,
            )
        return {"status": "ok"}

    @app.get("/health_generate")
    async def health_generate():
        prompt = [state.tokenizer.bos_token_id or 0]
        # its own seed, so health probes do not shift the server's sampling stream
        await _generate_in_pool([prompt], {"max_new_tokens": 1}, 0, [threading.Event()], None)
        return {"status": "ok"}

    @app.api_route("/get_weights_by_name", methods=["GET", "POST"])
    async def get_weights_by_name(request: Request):
        # SGLang reads a JSON body even on GET; query parameters are accepted too.
        try:
            body = orjson.loads(raw) if (raw := await request.body()) else dict(request.query_params)
        except orjson.JSONDecodeError as exc:
            raise BadRequest(f"body: not valid JSON ({exc})") from exc
        if not isinstance(body, dict):
            raise BadRequest(f"body: a JSON object with name and truncate_size, got {type(body).__name__}")
        try:
            req = p.WeightsByNameReq.model_validate(body)
        except ValidationError as exc:
            raise BadRequest(p.validation_message(exc)) from exc
        return await asyncio.to_thread(state.weights_by_name, req.name, req.truncate_size)

    @app.get("/model_info")
    async def model_info():
        return state.model_info()

    @app.get("/get_model_info")  # SGLang's deprecated alias
    async def get_model_info():
        return state.model_info()

    @app.get("/server_info")
    async def server_info():
        # the launch arguments the clients read, with SGLang's names; dtype is resolved
        return {
            "model_path": state.model_path,
            "dtype": str(next(state.model.parameters()).dtype).removeprefix("torch."),
            "tp_size": 1,
            "version": "builtin",
        }

    return app


def main(argv: list[str] | None = None) -> None:
    import uvicorn

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
    args = parser.parse_args(argv)
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
    try:
        # a short graceful shutdown: a request blocked in a collective must not hold SIGTERM up
        uvicorn.run(app, host=args.host, port=args.port, log_level="warning", timeout_graceful_shutdown=2)
    finally:
        state.offload.discard()  # a released model's copy on disk


if __name__ == "__main__":
    main()
