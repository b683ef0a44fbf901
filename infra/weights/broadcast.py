"""The sending side of broadcast weight sync, on trainer rank 0.

Rank 0 is rank 0 of a weight-update group with every engine rank. Per bucket it posts
`/update_weights_from_distributed` (names, dtypes, shapes) to every engine and then
broadcasts the bucket in the engines' dtype; the engines receive into buffers they
allocate from the request. By default a bucket travels as one flat byte buffer
(`load_format="flattened_bucket"`, which SGLang's engines accept on this route): one
collective per bucket instead of one per tensor. The whole sync runs inside an update
session on servers that have them.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import defaultdict
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager, suppress
from dataclasses import dataclass

import torch
import torch.distributed as dist

from infra.engines.client import TIMINGS_HEADER, timings_of, weights_update_body
from infra.engines.lanes import EngineLanes
from infra.weights.buckets import FLATTENED_BUCKET, dtype_name
from infra.weights.engines import EngineLink, common_dtype, group_layout
from infra.weights.group import broadcast_async, close_update_group, host_update_store, open_update_group
from infra.weights.payload import empty_bucket, filled_bucket, reuse_bucket

UPDATE_ROUTE = "/update_weights_from_distributed"


def pack(tensors: list[torch.Tensor], dtype: torch.dtype) -> torch.Tensor:
    """The tensors cast to `dtype`, back to back in one new byte buffer (flattened_bucket)."""
    if not tensors:
        raise ValueError("pack: an empty bucket")
    return filled_bucket(tensors, dtype, True, tensors[0].device)[0]


@dataclass
class PendingBucket:
    """A bucket announced to the engines, whose tensors are still to be broadcast."""

    names: list[str]
    posts: list[Future]


@dataclass
class Transfer:
    """A bucket whose broadcast is under way; `BroadcastSender.finish` waits for it."""

    pending: PendingBucket
    payload: list[torch.Tensor]
    works: list[dist.Work]


class EarlierBucketFailed(RuntimeError):
    """A bucket's request was not sent: the bucket before it failed on some engine."""


class BroadcastSender:
    def __init__(
        self, links: list[EngineLink], group_name: str, timeout_s: float = 300, flatten: bool = True
    ):
        self.links = links
        self.group_name = group_name
        self.timeout_s = timeout_s
        self.flatten = flatten
        self.dtype = common_dtype(links)
        self.group: dist.ProcessGroup | None = None
        self.device = torch.device("cpu")  # where payloads live: gloo moves CPU tensors, nccl GPU ones
        # one lane per engine runs its requests in order (session begin, then each bucket's
        # post), all lanes on one event-loop thread, while this thread gathers and broadcasts;
        # made once the group is open (a sender whose group never formed holds no thread)
        self._lanes: EngineLanes | None = None
        self._begins: list[Future] = []  # the open session's begin, per engine
        self._abandoned = threading.Event()  # set when the open session's sync failed
        self.timings: defaultdict[str, float] = defaultdict(float)

    def open(self, address: str, port: int, backend: str) -> None:
        """Form the group: every engine's join request blocks until all ranks are in. The
        group's store listens on `port` (0: one the OS picks) before the engines are told it."""
        try:
            self._open(address, port, backend)
        except Exception as exc:
            raise self.peer_error("forming the weight-update group", exc) from exc

    def _open(self, address: str, port: int, backend: str) -> None:
        self.device = torch.device("cuda" if backend == "nccl" else "cpu")
        offsets, world_size = group_layout([link.tp_size for link in self.links])
        store = host_update_store(address, world_size, self.timeout_s, port)
        with ThreadPoolExecutor(max_workers=len(self.links)) as pool:
            joins = [
                pool.submit(
                    link.client.init_weights_update_group,
                    address,
                    store.port,
                    offset,
                    world_size,
                    self.group_name,
                    backend,
                )
                for link, offset in zip(self.links, offsets, strict=True)
            ]
            self.group = open_update_group(
                address,
                store.port,
                0,
                world_size,
                group_name=self.group_name,
                timeout_s=self.timeout_s,
                backend=backend,
                store=store,
            )
            for join in joins:
                join.result(timeout=self.timeout_s)
        self._lanes = EngineLanes(len(self.links))

    @contextmanager
    def session(self) -> Iterator[None]:
        """Wrap a whole sync: every engine paused and inside an update session where it has them.

        Each engine is paused first (`PAUSE_MODE`: its running requests are retracted, not
        lost), so the session and the updates never wait behind a long generation. The
        session begins in the background (each engine's pause and begin are first on its
        queue, so its posts follow them): the round trips overlap the first gather. It ends
        here, once the sync's buckets are all in, and generation resumes; a failed sync
        still closes the sessions it opened and resumes every engine it paused."""
        if self.group is None:
            raise RuntimeError("weight sync before the weight-update group was opened")
        self._abandoned = threading.Event()
        self._begins = [self._lanes.submit(i, self._begin, link) for i, link in enumerate(self.links)]
        try:
            yield
            for begin in self._begins:  # a begin that failed fails the sync, buckets or not
                begin.result(timeout=self.timeout_s)
        except BaseException:
            self._abandoned.set()  # posts of this sync still queued are never sent
            # the clean-up queues behind the engine's pause, begin and posts: it cannot run
            # before a late pause or begin lands, nor leave a session or a pause behind
            cleanups = [
                self._lanes.submit(i, self._abandon, link, begin)
                for i, (link, begin) in enumerate(zip(self.links, self._begins, strict=True))
            ]
            for cleanup in cleanups:
                with suppress(Exception):  # report the failure that got us here
                    cleanup.result(timeout=self.timeout_s)
            raise
        finally:
            self._begins = []
        t0 = time.perf_counter()
        ends = [self._lanes.submit(i, self._end, link) for i, link in enumerate(self.links)]
        for end in ends:
            end.result(timeout=self.timeout_s)
        self.timings["session_end_s"] += time.perf_counter() - t0

    async def _begin(self, link: EngineLink) -> None:
        t0 = time.perf_counter()
        await link.pause_and_begin(self._lanes)
        self.timings["session_begin_s"] += time.perf_counter() - t0  # overlapped, not waited

    async def _abandon(self, link: EngineLink, begin: Future) -> None:
        """A failed sync, on the engine's lane: close its session if it opened, resume it."""
        try:
            if begin.exception(timeout=0) is None:  # done: it ran before, on this lane
                await link.end_session(self._lanes)
        finally:
            await link.resume(self._lanes)

    async def _end(self, link: EngineLink) -> None:
        await link.end_and_resume(self._lanes)

    async def _post(self, index: int, abandoned: threading.Event, after: PendingBucket | None, *args) -> dict:
        # an engine that gets this request waits in its receive for a broadcast: never send
        # it for a sync that already failed (its broadcast will not come)
        if abandoned.is_set():
            raise EarlierBucketFailed("the sync failed before this bucket's request was sent")
        if self._begins:  # already done: it ran first on this lane; its failure is the post's
            self._begins[index].result(timeout=0)
        if after is not None:
            # An engine that gets a request waits in its receive for the broadcast. Send it
            # only when every engine took the bucket before, which is exactly when the
            # caller goes on to broadcast this one (see `announce`).
            posts = [asyncio.wrap_future(post) for post in after.posts]
            done, running = await asyncio.wait(
                posts, timeout=self.timeout_s, return_when=asyncio.FIRST_EXCEPTION
            )
            if any(post.exception() is not None for post in done):
                raise EarlierBucketFailed(f"bucket of {after.names[0]!r}... failed first")
            if running:
                raise TimeoutError(f"bucket of {after.names[0]!r}... unanswered after {self.timeout_s} s")
        body = weights_update_body(*args)
        _, headers = await self._lanes.call(self.links[index].client, "POST", UPDATE_ROUTE, body)
        return timings_of(headers.get(TIMINGS_HEADER))

    def announce(
        self,
        names: list[str],
        shapes: list[list[int]],
        last: bool,
        version: str,
        after: PendingBucket | None = None,
    ) -> PendingBucket:
        """Post the bucket's `/update_weights_from_distributed` to every engine, in the
        background, and return at once: names, dtypes and shapes are known before the
        tensors are gathered, so the HTTP round trip overlaps the gathers. The engines then
        wait in their receive until the bucket is broadcast (`start`).

        `after`: the bucket announced before, which may still be in flight. Each engine's
        requests run in order on its own thread, so this one goes out as soon as every
        engine answered `after` (no wait for the caller); if any engine failed it, this
        request is not sent at all. So the caller may announce (and gather) bucket i+1
        while bucket i is on the wire, and must broadcast it exactly when `finish` of
        bucket i succeeded."""
        if self.group is None:
            raise RuntimeError("weight sync before the weight-update group was opened")
        t0 = time.perf_counter()
        dtypes = [dtype_name(self.dtype)] * len(names)
        load_format = FLATTENED_BUCKET if self.flatten else None
        posts = [
            self._lanes.submit(
                i,
                self._post,
                i,
                self._abandoned,
                after,
                names,
                dtypes,
                [list(s) for s in shapes],
                self.group_name,
                last,  # flush the engine's cache once, after the last bucket
                version,
                load_format,
            )
            for i in range(len(self.links))
        ]
        self.timings["announce_s"] += time.perf_counter() - t0
        return PendingBucket(names, posts)

    def allocate(
        self, shapes: list[list[int]], reuse: list[torch.Tensor] | None = None
    ) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """An empty payload for a bucket, in the engines' dtype on the group's device, and
        per tensor a view of it to fill (then `transmit` the payload). `reuse`: an old
        payload the caller no longer needs, taken when it fits; otherwise a fresh one, which
        the caller may keep."""
        if reuse is not None and all(t.device == self.device for t in reuse):
            views = reuse_bucket(reuse, shapes, self.dtype, self.flatten)
            if views is not None:
                return reuse, views
        return empty_bucket(shapes, self.dtype, self.flatten, self.device)

    def prepare(self, tensors: list[torch.Tensor]) -> list[torch.Tensor]:
        """The payload of these tensors, cast to the engines' dtype (one copy each)."""
        t0 = time.perf_counter()
        payload = filled_bucket(tensors, self.dtype, self.flatten, self.device)
        self.timings["pack_s"] += time.perf_counter() - t0
        return payload

    def transmit(self, pending: PendingBucket, payload: list[torch.Tensor]) -> int:
        """Broadcast a prepared payload to the engines that `pending` announced it to, and
        wait for their replies; returns the bytes sent."""
        return self.finish(self.start(pending, payload))

    def start(self, pending: PendingBucket, payload: list[torch.Tensor]) -> Transfer:
        """Start broadcasting a prepared payload to the engines that `pending` announced it
        to, and return at once: the caller may gather the next bucket meanwhile. At most
        one bucket in flight: `finish` it before starting the next (its request waits for
        this one's replies, see `announce`)."""
        try:
            return self._start(pending, payload)
        except Exception as exc:
            raise self.peer_error("weight sync", exc) from exc

    def finish(self, transfer: Transfer) -> int:
        """Wait for a started broadcast and the engines' replies; returns the bytes sent."""
        try:
            return self._finish(transfer)
        except Exception as exc:
            raise self.peer_error("weight sync", exc) from exc

    def send_bucket(self, names: list[str], tensors: list[torch.Tensor], last: bool, version: str) -> int:
        """Announce, prepare and broadcast one bucket of tensors; returns the bytes sent."""
        pending = self.announce(names, [list(t.shape) for t in tensors], last, version)
        return self.transmit(pending, self.prepare(tensors))

    def peer_error(self, what: str, exc: Exception) -> RuntimeError:
        """The error of a failed group step, naming the engines that no longer answer (a gloo
        "connection closed by peer" alone says nothing of which engine it was)."""
        dead = [link.url for link in self.links if not link.client.health()]
        who = f"engine {', '.join(dead)} not answering" if dead else f"engines {[k.url for k in self.links]}"
        return RuntimeError(f"{what} failed ({who}): {type(exc).__name__}: {exc}")

    def _start(self, pending: PendingBucket, payload: list[torch.Tensor]) -> Transfer:
        for begin in self._begins:
            # the engines cannot receive before their session began (nothing is lost waiting:
            # their posts follow it); a begin that failed must not leave a broadcast hanging
            begin.result(timeout=self.timeout_s)
        for post in pending.posts:
            if post.done():  # refused before its receive (e.g. 400): broadcasting would only hang
                post.result()
        # all in flight at once, as SGLang's receiver posts them; waited in order
        works = [broadcast_async(self.group, tensor, src=0) for tensor in payload]
        return Transfer(pending, payload, works)

    def _finish(self, transfer: Transfer) -> int:
        t0 = time.perf_counter()
        for work in transfer.works:
            work.wait()
        t1 = time.perf_counter()
        for post in transfer.pending.posts:
            # the built-in engine reports its own phases; SGLang reports none ({})
            for key, seconds in (post.result(timeout=self.timeout_s) or {}).items():
                self.timings[f"engine_{key}"] += seconds
        t2 = time.perf_counter()
        # what this thread waited: a broadcast that ran beside a gather shows only its tail
        self.timings["broadcast_s"] += t1 - t0
        self.timings["reply_wait_s"] += t2 - t1
        return sum(t.numel() * t.element_size() for t in transfer.payload)

    def _destroy(self, link: EngineLink) -> str | None:
        try:
            link.client.destroy_weights_update_group(self.group_name)
        except Exception as exc:  # noqa: BLE001 - an engine may already be gone
            return f"{link.url}: {exc}"
        return None

    def take_timings(self) -> dict[str, float]:
        """Seconds per phase since the last call, summed over buckets and engines:
        `session_begin_s` (round trips run in the background), `announce_s`, `pack_s`
        (`prepare` only), `broadcast_s` and `reply_wait_s` (waited in `finish`: the part of
        the broadcast not hidden behind the caller's work since `start`), `session_end_s`,
        and the engines' own `engine_time_receive_s` / `engine_time_load_s` where they
        report them."""
        out, self.timings = dict(self.timings), defaultdict(float)
        return out

    def close(self) -> None:
        """Destroy the group on every engine, all at once, then here (each side tears down its
        own end). Not on the engines' queues: a post that hangs on a dead engine would hold it."""
        with ThreadPoolExecutor(max(1, len(self.links)), thread_name_prefix="weight-close") as pool:
            outcomes = list(pool.map(self._destroy, self.links))
        errors = [error for error in outcomes if error is not None]
        if self.group is not None:
            close_update_group(self.group)
            self.group = None
        if self._lanes is not None:
            self._lanes.close()
            self._lanes = None
        if errors:
            raise RuntimeError(f"destroy_weights_update_group failed on {errors}")
