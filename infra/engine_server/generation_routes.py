"""The built-in server's generation: /generate and the routes that pause, resume and abort
it, run in threads of their own off the event loop."""

from __future__ import annotations

import asyncio
import functools
from concurrent.futures import ThreadPoolExecutor

import orjson
from fastapi import FastAPI, Request
from fastapi.responses import Response

from infra.engine_server import protocol as p
from infra.engine_server.engine_state import EngineState
from infra.engine_server.guards import Progress, RowAborts
from infra.engine_server.protocol import BadRequest
from infra.model.tokenizer import decode_many


class Generation:
    """Runs the model's generation for the routes, and holds new requests while paused."""

    def __init__(self, state: EngineState, max_request_tokens: int) -> None:
        self.state = state
        self.max_request_tokens = max_request_tokens
        self.max_positions = getattr(state.model.config, "max_position_embeddings", None)
        self.running = asyncio.Event()  # cleared by /pause_generation: new requests wait
        self.running.set()
        # Generation has its own threads: weight-group joins blocked on an absent peer, or
        # the other routes' work in the default pool, must not starve it.
        self.pool = ThreadPoolExecutor(4, thread_name_prefix="generate")
        self.progress = Progress()

    async def run(self, batch, params, seed, aborts: RowAborts, request: Request | None, adapters=None):
        """`state.generate` in the generation threads; a client that hangs up aborts it.
        `adapters`: each row's LoRA adapter (None: the base weights)."""
        progress = self.progress
        with progress.lock:
            if not progress.active:
                progress.beat()
            progress.active += 1
        try:
            call = functools.partial(self.state.generate, batch, params, seed, aborts, adapters)
            task = asyncio.get_running_loop().run_in_executor(self.pool, call)
            while True:
                done, _ = await asyncio.wait({task}, timeout=0.25)
                if done:
                    return task.result()
                if request is not None and await request.is_disconnected():
                    aborts.set()  # the client is gone: the decode loop ends at its next step
        finally:
            with progress.lock:
                progress.active -= 1
                progress.beat()

    async def generate(self, req: p.GenerateReq, request: Request) -> Response:
        """One /generate: every input's n samples in one batch, replies as SGLang's."""
        if req.stream:
            raise BadRequest("stream: streaming is not supported by the built-in engine")
        state = self.state
        # tokenizing long text takes a while: off the event loop (/health answers there), in
        # generation's own threads (hung group joins may hold all of the default ones)
        prompts, single = await asyncio.get_running_loop().run_in_executor(
            self.pool,
            p.prompts_of,
            req,
            state.tokenizer,
            state.model.config.vocab_size,
            self.max_request_tokens,
        )
        sps = p.sampling_params_of(req, len(prompts))
        sp, n = p.shared_params(sps), sps[0].n
        p.check_limits(sp, n, prompts, self.max_positions)
        rids = p.rids_of(req.rid, len(prompts), n, single)
        params = _decode_params(sp, state)
        # n samples of each input, input-major as SGLang orders them
        rows = [(prompt, isp) for prompt, isp in zip(prompts, sps, strict=True) for _ in range(n)]
        seeds = p.seeds_of(req, sps, n)
        names = [name for name in p.lora_names_of(req, len(prompts)) for _ in range(n)]
        # held from here to the reply, so an unload waits for this request (and may read disk)
        adapters = await asyncio.get_running_loop().run_in_executor(self.pool, state.loras.acquire, names)
        aborts = state.register(rids, self.progress)
        try:
            await self.running.wait()
            batch = [prompt for prompt, _ in rows]
            outs, version = await self.run(batch, params, seeds, aborts, request, adapters)
        finally:
            state.unregister(rids, aborts)
            state.loras.release(adapters)
        # the texts in one call (inputs share every parameter but the seed)
        ids = [p.text_ids(o, sp) for o in outs]
        texts = decode_many(state.tokenizer, ids, sp.skip_special_tokens)
        replies = [
            p.reply(o, text, len(pr), rid, version, req)
            for o, (pr, _), rid, text in zip(outs, rows, rids, texts, strict=True)
        ]
        # plain JSON types already: skip FastAPI's per-item encoder walk (~1 ms per 100 tokens),
        # and write them with orjson, ~20x faster than the json module on the logprob floats
        # (the same shortest round-trip text for every float)
        return Response(
            orjson.dumps(replies[0] if single and n == 1 else replies), media_type="application/json"
        )


def _decode_params(sp: p.SamplingParams, state: EngineState) -> dict:
    """The request's shared sampling parameters as `EngineState.generate` takes them."""
    return {
        "max_new_tokens": sp.max_new_tokens,
        "temperature": sp.temperature,
        "top_p": sp.top_p,
        "top_k": sp.top_k,
        "stop_token_ids": p.stop_ids_of(sp, state.tokenizer),
        "ignore_eos": sp.ignore_eos,
    }


def add_generation_routes(app: FastAPI, generation: Generation) -> None:
    """/generate, /pause_generation, /continue_generation and /abort_request."""
    state = generation.state

    @app.post("/generate")
    async def generate(request: Request):
        # parsed by pydantic's own JSON reader: FastAPI's json.loads and then a validation of
        # the Python objects took twice as long for a 1024-input body (a ValidationError
        # answers 400 as FastAPI's would, server.py)
        req = p.GenerateReq.model_validate_json(await request.body())
        return await generation.generate(req, request)

    @app.post("/pause_generation")
    async def pause(req: p.PauseReq):
        generation.running.clear()
        if req.mode == "abort":
            state.abort(abort_all=True)
        return {"success": True, "message": f"paused ({req.mode})"}

    @app.post("/continue_generation")
    async def resume():
        generation.running.set()
        return {"success": True, "message": "continued"}

    @app.post("/abort_request")
    async def abort(req: p.AbortReq):
        state.abort(req.rid, req.abort_all)
        return {"success": True, "message": "aborted"}
