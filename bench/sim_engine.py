"""Simulated rollout engines: asyncio HTTP servers that answer SGLang's routes without a model.

    python -m bench.sim_engine --engines 32 --url-file urls.json [--spec '{"slots": 64}']

Many engines share one process (one aiohttp app per engine on its own port, one event loop);
`bench.scale_sweep` starts a few such processes. What an engine models:

- a response's length is drawn from its `sampling_seed` (lognormal around `median_tokens`,
  and `tail_fraction` of the samples `tail_factor` times longer), so the same rollout gives
  the same lengths on any engine, and it stops at `max_new_tokens` (finish `length`);
- continuous batching: an engine decodes up to `slots` sequences at once, each at
  `slot_tokens_per_s` whatever the others do (decode is memory bound: a step costs about the
  same at any batch size below the engine's limit); more sequences wait for a free slot in
  arrival order. A batch /generate answers when its last sequence is done, as SGLang does;
- /pause_generation holds sequences that have not started; /abort_request ends a sequence at
  once with the tokens it has (finish `abort`), a waiting one with none;
- weight updates (group, session, distributed, disk) only record the version they name:
  no tensor arrives (nothing broadcasts to a simulated engine);
- a control route (pause, continue, the weight routes, /server_info) answers after `control_s`, as a real
  engine's take a while: a caller that posts to many engines one at a time shows it.

Replies have the shape of the built-in server's (infra/engine_server/protocol.py `reply`):
`text`, `output_ids`, `meta_info` with `id`, `finish_reason`, `prompt_tokens`,
`completion_tokens`, `cached_tokens`, `output_token_logprobs` as `[logprob, id, null]` and
`weight_version`. Token ids and logprobs come from one table drawn at start, sliced per sample.
`GET /sim_stats` (not an SGLang route) reports what the engine served.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import math
import os
import random
import sys
from dataclasses import asdict, dataclass, field

import numpy as np
import orjson
from aiohttp import web

TABLE = 1 << 16  # token ids and logprobs drawn once; each sample reads a slice at its own offset


@dataclass(frozen=True)
class SimSpec:
    """The simulated engine's response lengths and speed."""

    median_tokens: float = 64.0
    sigma: float = 0.8
    tail_fraction: float = 0.01
    tail_factor: float = 10.0
    slots: int = 64
    slot_tokens_per_s: float = 40.0
    vocab: int = 40  # ids drawn in [4, vocab): the tiny model's characters (0..3 are special)
    control_s: float = 0.0  # how long a control route takes to answer

    def length(self, seed: int) -> int:
        """Response tokens of the sample with this sampling_seed (before max_new_tokens)."""
        rng = random.Random(seed)
        n = rng.lognormvariate(math.log(self.median_tokens), self.sigma)
        if rng.random() < self.tail_fraction:
            n *= self.tail_factor
        return max(1, round(n))


@dataclass
class Stats:
    requests: int = 0
    samples: int = 0
    tokens: int = 0
    aborted: int = 0
    weight_version: str = "0"
    updates: int = 0
    routes: dict[str, int] = field(default_factory=dict)


@functools.cache
def _table(vocab: int) -> tuple[list[int], list[list]]:
    """Token ids and their `[logprob, id, null]` reply entries, drawn once per process and
    shared by its engines: a reply is a slice of them (building the entries per token took
    half of the engines' CPU, and a busy event loop answers every engine late)."""
    rng = np.random.default_rng(0)
    ids = rng.integers(4, vocab, TABLE).tolist()
    logprobs = (-rng.exponential(1.0, TABLE)).round(4).tolist()
    return ids, [[lp, t, None] for lp, t in zip(logprobs, ids, strict=True)]


class SimEngine:
    def __init__(self, spec: SimSpec, index: int) -> None:
        self.spec = spec
        self.index = index
        self.stats = Stats()
        self.slots = asyncio.Semaphore(spec.slots)
        self.running = asyncio.Event()
        self.running.set()
        self.inflight: dict[str, asyncio.Future] = {}  # rid -> settles True when aborted
        self.ids, self.entries = _table(spec.vocab)

    async def _decode(self, rid: str, n: int) -> tuple[int, bool]:
        """Hold a slot for n tokens' time; (tokens made, aborted). Abortable from its arrival:
        one aborted while it waits for a slot (SGLang's waiting queue) makes no tokens."""
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        self.inflight[rid] = fut
        try:
            async with self.slots:
                if not self.running.is_set():  # paused: wait for /continue_generation or an abort
                    resumed = asyncio.ensure_future(self.running.wait())
                    await asyncio.wait([resumed, fut], return_when=asyncio.FIRST_COMPLETED)
                    resumed.cancel()
                if fut.done():
                    return 0, True
                start = loop.time()
                handle = loop.call_later(n / self.spec.slot_tokens_per_s, _settle, fut, False)
                try:
                    aborted = await fut
                finally:
                    handle.cancel()
        finally:
            self.inflight.pop(rid, None)
        if aborted:
            made = int((loop.time() - start) * self.spec.slot_tokens_per_s)
            return max(1, min(n, made)), True
        return n, False

    def _reply(
        self, rid: str, prompt_len: int, seed: int, n: int, made: int, aborted: bool, sp: dict
    ) -> dict:
        at = seed % (TABLE - n)
        ids, entries = self.ids[at : at + made], self.entries[at : at + made]
        stops = sp.get("stop_token_ids") or []
        if aborted:
            finish = {"type": "abort", "message": "aborted"}
        elif made < sp.get("max_new_tokens", 128) and stops:
            ids[-1] = stops[0]
            entries[-1] = [entries[-1][0], stops[0], None]
            finish = {"type": "stop", "matched": stops[0]}
        else:
            finish = {"type": "length", "length": made}
        meta = {
            "id": rid,
            "finish_reason": finish,
            "prompt_tokens": prompt_len,
            "completion_tokens": made,
            "cached_tokens": 0,
            "weight_version": self.stats.weight_version,
            "output_token_logprobs": entries,
        }
        return {"text": "", "output_ids": ids, "meta_info": meta}

    async def generate(self, request: web.Request) -> web.Response:
        body = orjson.loads(await request.read())
        inputs = body["input_ids"]
        single = bool(inputs) and isinstance(inputs[0], int)
        inputs = [inputs] if single else inputs
        sps = body.get("sampling_params") or {}
        sps = sps if isinstance(sps, list) else [sps] * len(inputs)
        rids = body.get("rid")
        if not isinstance(rids, list):
            base = rids or f"sim{self.index}-{self.stats.requests}"
            rids = [base] if single else [f"{base}_{i}" for i in range(len(inputs))]
        if any(sp.get("n", 1) != 1 for sp in sps):
            return _error(
                400, "n > 1: the simulated engine takes one sample per input (the manager sends so)"
            )
        seeds = [int(sp.get("sampling_seed", i)) for i, sp in enumerate(sps)]
        wanted = [
            min(self.spec.length(s), sp.get("max_new_tokens", 128)) for s, sp in zip(seeds, sps, strict=True)
        ]
        self.stats.requests += 1
        done = await asyncio.gather(*(self._decode(r, n) for r, n in zip(rids, wanted, strict=True)))
        replies = [
            self._reply(rid, len(ids), seed, n, made, aborted, sp)
            for rid, ids, seed, n, (made, aborted), sp in zip(
                rids, inputs, seeds, wanted, done, sps, strict=True
            )
        ]
        self.stats.samples += len(replies)
        self.stats.tokens += sum(made for made, _ in done)
        self.stats.aborted += sum(aborted for _, aborted in done)
        return web.Response(
            body=orjson.dumps(replies[0] if single else replies), content_type="application/json"
        )

    async def abort(self, request: web.Request) -> web.Response:
        body = await _json(request)
        rid = body.get("rid") or ""
        targets = list(self.inflight) if body.get("abort_all") else [r for r in self.inflight if r == rid]
        for r in targets:
            _settle(self.inflight[r], True)
        return _ok(f"aborted {len(targets)}")

    async def pause(self, request: web.Request) -> web.Response:
        self.running.clear()
        await self._control_time()
        return _ok("paused")

    async def resume(self, request: web.Request) -> web.Response:
        await self._control_time()
        self.running.set()
        return _ok("continued")

    async def update(self, request: web.Request) -> web.Response:
        body = await _json(request)
        await self._control_time()
        if body.get("weight_version") is not None:
            self.stats.weight_version = str(body["weight_version"])
        self.stats.updates += 1
        return _ok("updated (simulated: no tensors)")

    async def _control_time(self) -> None:
        if self.spec.control_s > 0:  # none by default: the sweep's engines answer at once
            await asyncio.sleep(self.spec.control_s)

    async def ok(self, request: web.Request) -> web.Response:
        return _ok("ok")

    async def control(self, request: web.Request) -> web.Response:
        await self._control_time()
        return _ok("ok")

    async def model_info(self, request: web.Request) -> web.Response:
        info = {"model_path": "simulated", "weight_version": self.stats.weight_version, "is_generation": True}
        return web.json_response(info)

    async def server_info(self, request: web.Request) -> web.Response:
        await self._control_time()
        return web.json_response({"dtype": "float32", "tp_size": 1, "simulated": asdict(self.spec)})

    async def sim_stats(self, request: web.Request) -> web.Response:
        return web.json_response(asdict(self.stats))

    @web.middleware
    async def _count(self, request: web.Request, handler):
        routes = self.stats.routes
        routes[request.path] = routes.get(request.path, 0) + 1
        return await handler(request)

    def app(self) -> web.Application:
        app = web.Application(client_max_size=1 << 30, middlewares=[self._count])
        app.router.add_post("/generate", self.generate)
        app.router.add_post("/abort_request", self.abort)
        app.router.add_post("/pause_generation", self.pause)
        app.router.add_post("/continue_generation", self.resume)
        for route in ("/update_weights_from_distributed", "/update_weights_from_disk"):
            app.router.add_post(route, self.update)
        for route in ("/init_weights_update_group", "/destroy_weights_update_group", "/begin_weight_update",
                      "/end_weight_update", "/release_memory_occupation", "/resume_memory_occupation"):  # fmt: skip
            app.router.add_post(route, self.control)
        app.router.add_route("*", "/flush_cache", self.ok)
        for route in ("/health", "/health_generate"):
            app.router.add_get(route, self.ok)
        app.router.add_get("/model_info", self.model_info)
        app.router.add_get("/server_info", self.server_info)
        app.router.add_get("/sim_stats", self.sim_stats)
        return app


def _settle(fut: asyncio.Future, aborted: bool) -> None:
    if not fut.done():
        fut.set_result(aborted)


async def _json(request: web.Request) -> dict:
    raw = await request.read()
    return orjson.loads(raw) if raw else {}


def _ok(message: str) -> web.Response:
    return web.json_response({"success": True, "message": message})


def _error(status: int, message: str) -> web.Response:
    return web.json_response({"success": False, "message": message}, status=status)


async def serve(spec: SimSpec, count: int, host: str = "127.0.0.1", first_index: int = 0) -> list[str]:
    """Start `count` engines in this event loop; their URLs (they serve until the loop ends)."""
    urls = []
    for i in range(count):
        runner = web.AppRunner(SimEngine(spec, first_index + i).app(), access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, host, 0, backlog=1024)
        await site.start()
        port = runner.addresses[0][1]
        urls.append(f"http://{host}:{port}")
    return urls


async def _main(args: argparse.Namespace) -> None:
    spec = SimSpec(**json.loads(args.spec))
    urls = await serve(spec, args.engines, first_index=args.first_index)
    with open(args.url_file + ".tmp", "w") as f:
        json.dump(urls, f)
    os.replace(args.url_file + ".tmp", args.url_file)  # the reader sees all URLs or none
    await asyncio.Event().wait()


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.sim_engine", description=__doc__.split("\n")[0])
    ap.add_argument("--engines", type=int, default=1)
    ap.add_argument("--first-index", type=int, default=0, help="index of the first engine (its token table)")
    ap.add_argument("--spec", default="{}", help="SimSpec fields as JSON")
    ap.add_argument("--url-file", required=True, help="where the engines' URLs are written (JSON list)")
    asyncio.run(_main(ap.parse_args(argv)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
