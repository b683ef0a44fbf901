"""The built-in server's health and information routes."""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.responses import JSONResponse

from infra.engine_server.engine_state import EngineState
from infra.engine_server.generation_routes import Generation
from infra.engine_server.guards import RowAborts


def add_health_routes(app: FastAPI, generation: Generation, stall_s: float) -> None:
    """/health (503 once generation makes no progress for `stall_s`) and /health_generate."""
    state = generation.state

    @app.get("/health")
    async def health():
        stalled = generation.progress.stalled_for()
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
        await generation.run([prompt], {"max_new_tokens": 1}, 0, RowAborts(1), None)
        return {"status": "ok"}


def add_info_routes(app: FastAPI, state: EngineState) -> None:
    """What the clients read about the model and the server's launch."""

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
