"""The sending side of broadcast weight sync, on trainer rank 0.

Rank 0 is rank 0 of a weight-update group with every engine rank. Per bucket it posts
`/update_weights_from_distributed` (names, dtypes, shapes) to every engine and then
broadcasts the tensors, in the engines' dtype, in the order of the names; the engines
receive into buffers they allocate from the request. The whole sync runs inside an
update session on servers that have them.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager

import torch
import torch.distributed as dist

from infra.weights.buckets import dtype_name
from infra.weights.engines import EngineLink, common_dtype, group_layout, update_sessions
from infra.weights.group import broadcast, close_update_group, open_update_group


class BroadcastSender:
    def __init__(self, links: list[EngineLink], group_name: str, timeout_s: float = 300):
        self.links = links
        self.group_name = group_name
        self.timeout_s = timeout_s
        self.dtype = common_dtype(links)
        self.group: dist.ProcessGroup | None = None

    def open(self, address: str, port: int, backend: str) -> None:
        """Form the group: every engine's join request blocks until all ranks are in."""
        try:
            self._open(address, port, backend)
        except Exception as exc:
            raise self.peer_error("forming the weight-update group", exc) from exc

    def _open(self, address: str, port: int, backend: str) -> None:
        offsets, world_size = group_layout([link.tp_size for link in self.links])
        with ThreadPoolExecutor(max_workers=len(self.links)) as pool:
            joins = [
                pool.submit(
                    link.client.init_weights_update_group,
                    address,
                    port,
                    offset,
                    world_size,
                    self.group_name,
                    backend,
                )
                for link, offset in zip(self.links, offsets, strict=True)
            ]
            self.group = open_update_group(
                address,
                port,
                0,
                world_size,
                group_name=self.group_name,
                timeout_s=self.timeout_s,
                backend=backend,
            )
            for join in joins:
                join.result(timeout=self.timeout_s)

    def session(self) -> AbstractContextManager[None]:
        """Wrap a whole sync: every engine inside an update session where it has them."""
        if self.group is None:
            raise RuntimeError("weight sync before the weight-update group was opened")
        return update_sessions(self.links)

    def send_bucket(self, names: list[str], tensors: list[torch.Tensor], last: bool, version: str) -> int:
        """Announce and broadcast one bucket to every engine; returns the bytes sent."""
        try:
            return self._send_bucket(names, tensors, last, version)
        except Exception as exc:
            raise self.peer_error("weight sync", exc) from exc

    def peer_error(self, what: str, exc: Exception) -> RuntimeError:
        """The error of a failed group step, naming the engines that no longer answer (a gloo
        "connection closed by peer" alone says nothing of which engine it was)."""
        dead = [link.url for link in self.links if not link.client.health()]
        who = f"engine {', '.join(dead)} not answering" if dead else f"engines {[k.url for k in self.links]}"
        return RuntimeError(f"{what} failed ({who}): {type(exc).__name__}: {exc}")

    def _send_bucket(self, names: list[str], tensors: list[torch.Tensor], last: bool, version: str) -> int:
        sent = [t.to(self.dtype).contiguous() for t in tensors]
        dtypes = [dtype_name(t.dtype) for t in sent]
        shapes = [list(t.shape) for t in sent]
        with ThreadPoolExecutor(max_workers=len(self.links)) as pool:
            posts = [
                pool.submit(
                    link.client.update_weights_from_distributed,
                    names,
                    dtypes,
                    shapes,
                    self.group_name,
                    last,  # flush the engine's cache once, after the last bucket
                    version,
                )
                for link in self.links
            ]
            for tensor in sent:
                broadcast(self.group, tensor, src=0)
            for post in posts:
                post.result(timeout=self.timeout_s)
        return sum(t.numel() * t.element_size() for t in sent)

    def close(self) -> None:
        """Destroy the group on every engine, then here (each side tears down its own end)."""
        errors = []
        for link in self.links:
            try:
                link.client.destroy_weights_update_group(self.group_name)
            except Exception as exc:  # noqa: BLE001 - an engine may already be gone
                errors.append(f"{link.url}: {exc}")
        if self.group is not None:
            close_update_group(self.group)
            self.group = None
        if errors:
            raise RuntimeError(f"destroy_weights_update_group failed on {errors}")
