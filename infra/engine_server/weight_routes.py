"""The built-in server's weight routes: the weight-update group and its broadcasts, loads
from disk, reading a weight back, and releasing or resuming the weights' memory."""

from __future__ import annotations

import asyncio
import json
from concurrent.futures import ThreadPoolExecutor

import orjson
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from pydantic import ValidationError

from infra.engine_server import protocol as p
from infra.engine_server.engine_state import EngineState
from infra.engine_server.protocol import BadRequest
from infra.engines.client import TIMINGS_HEADER


def add_weight_update_routes(app: FastAPI, state: EngineState) -> None:
    """Joining, using and leaving a weight-update group; loading weights from disk."""
    # Weight-group joins have their own threads: a join blocked on an absent peer holds its
    # thread for up to the group timeout, and a dozen of them must starve neither generation
    # nor the other routes (which use the default pool).
    join_pool = ThreadPoolExecutor(4, thread_name_prefix="group-join")

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
        _add_session_routes(app, state)

    @app.post("/update_weights_from_distributed")
    async def update_distributed(req: p.UpdateFromDistributedReq):
        args = (req.names, req.dtypes, req.shapes, req.group_name, req.weight_version, req.load_format)
        timings: dict[str, float] = {}
        error = await asyncio.to_thread(state.update_from_distributed, *args, timings=timings)
        if error:
            return p.failure(error)
        # the body is exactly SGLang's; this engine's own phase times ride in a header
        body = {"success": True, "message": f"updated {len(req.names)} tensors"}
        return JSONResponse(body, headers={TIMINGS_HEADER: json.dumps(timings)})

    @app.post("/update_weights_from_disk")
    async def update_disk(req: p.UpdateFromDiskReq):
        error = await asyncio.to_thread(state.update_from_disk, req.model_path, req.weight_version)
        return p.failure(error) if error else {"success": True, "message": f"loaded {req.model_path}"}

    @app.post("/destroy_weights_update_group")
    async def destroy_group(req: p.GroupNameReq):
        state.close_group(req.group_name)
        return {"success": True, "message": f"destroyed group {req.group_name!r}"}


def _add_session_routes(app: FastAPI, state: EngineState) -> None:
    # SGLang >= 0.5.23: distributed updates only between these two calls. Without the
    # switch the routes do not exist (404), as on SGLang 0.5.16.
    @app.post("/begin_weight_update")
    async def begin_update(req: p.BeginWeightUpdateReq):
        error = state.begin_update()
        return p.failure(error) if error else {"success": True, "message": "Success"}

    @app.post("/end_weight_update")
    async def end_update(req: p.EndWeightUpdateReq):
        error = state.end_update()
        return p.failure(error) if error else {"success": True, "message": "Success"}


def add_weight_memory_routes(app: FastAPI, state: EngineState) -> None:
    """Releasing and resuming the weights' memory (colocated runs), and SGLang's cache flush."""

    @app.post("/release_memory_occupation")
    async def release_memory(req: p.MemoryOccupationReq):
        freed = await asyncio.to_thread(state.release_memory, req.tags)
        return {"success": True, "message": f"released {freed} bytes of weights"}

    @app.post("/resume_memory_occupation")
    async def resume_memory(req: p.MemoryOccupationReq):
        await asyncio.to_thread(state.resume_memory, req.tags)
        return {"success": True, "message": "resumed"}

    @app.api_route("/flush_cache", methods=["GET", "POST"])
    async def flush_cache():
        return {"success": True, "message": "no prefix cache: nothing to flush"}


def add_weight_read_route(app: FastAPI, state: EngineState) -> None:
    """/get_weights_by_name, which the weight check reads the engine's weights through."""

    @app.api_route("/get_weights_by_name", methods=["GET", "POST"])
    async def get_weights_by_name(request: Request):
        req = _weights_by_name_req(await request.body(), dict(request.query_params))
        return await asyncio.to_thread(state.weights_by_name, req.name, req.truncate_size)


def _weights_by_name_req(raw: bytes, query: dict) -> p.WeightsByNameReq:
    # SGLang reads a JSON body even on GET; query parameters are accepted too.
    try:
        body = orjson.loads(raw) if raw else query
    except orjson.JSONDecodeError as exc:
        raise BadRequest(f"body: not valid JSON ({exc})") from exc
    if not isinstance(body, dict):
        raise BadRequest(f"body: a JSON object with name and truncate_size, got {type(body).__name__}")
    try:
        return p.WeightsByNameReq.model_validate(body)
    except ValidationError as exc:
        raise BadRequest(p.validation_message(exc)) from exc
