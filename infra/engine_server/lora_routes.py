"""The built-in server's LoRA routes, answered as SGLang 0.5.23 answers them:
`{"success", "error_message", "loaded_adapters"}`, HTTP 200, or 400 when refused.

POST /load_lora_adapter `{"lora_name", "lora_path"}` loads a PEFT adapter directory under a
name that requests then give as `lora_path`; POST /unload_lora_adapter `{"lora_name"}`
answers once the requests using the adapter have finished (`lora_registry`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from fastapi import FastAPI
from fastapi.responses import JSONResponse

from infra.engine_server import protocol as p
from infra.engine_server.engine_state import EngineState
from infra.engine_server.lora_registry import LoraRegistry
from infra.engine_server.protocol import BadRequest


def add_lora_routes(app: FastAPI, state: EngineState) -> None:
    registry = state.loras

    @app.post("/load_lora_adapter")
    async def load_lora_adapter(req: p.LoadLoraReq):
        return await _answer(registry, registry.load, req.lora_name, req.lora_path)

    @app.post("/unload_lora_adapter")
    async def unload_lora_adapter(req: p.UnloadLoraReq):
        return await _answer(registry, registry.unload, req.lora_name)


async def _answer(registry: LoraRegistry, call: Callable[..., dict[str, str]], *args: str):
    # in a thread: a load reads files, an unload waits for the requests using the adapter
    try:
        loaded = await asyncio.to_thread(call, *args)
    except BadRequest as exc:
        body = {"success": False, "error_message": str(exc), "loaded_adapters": registry.loaded()}
        return JSONResponse(body, status_code=400)
    return {"success": True, "error_message": "", "loaded_adapters": loaded}
