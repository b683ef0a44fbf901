"""The engines as the weight path sees them: their ranks in the weight-update group, the
dtype they hold their weights in, and which protocol generation they speak.

Everything here is asked of the engine itself, once, and remembered: the update session
is probed (SGLang 0.5.23 has `/begin_weight_update`, 0.5.16 answers 404), never guessed
from a version string.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from infra.engines.client import PAUSE_MODE, EngineClient, EngineError
from infra.engines.lanes import EngineLanes

if TYPE_CHECKING:
    import torch

# SGLang's answer (400) to a begin while a session is open; the built-in server says the same
STALE_SESSION = "already open"


def group_layout(tp_sizes: list[int]) -> tuple[list[int], int]:
    """Rank offsets of the engines and the group's world size (the trainer is rank 0).

    Engine i takes ranks `offset_i + tp_rank` for tp_rank < tp_sizes[i].
    """
    if any(tp < 1 for tp in tp_sizes):
        raise ValueError(f"rollout.tp_size: every engine needs at least one rank, got {tp_sizes}")
    offsets, next_rank = [], 1
    for tp in tp_sizes:
        offsets.append(next_rank)
        next_rank += tp
    return offsets, next_rank


def resolve_dtype(server_dtype: str | None, model_config: dict) -> torch.dtype:
    """The dtype an engine holds weights in, from its `dtype` launch argument.

    `auto` follows SGLang's own rule: the checkpoint's dtype, except that a float32
    checkpoint is served in float16 (bfloat16 for Gemma models).
    """
    import torch  # here: the links themselves import no torch (bench/sim_trainer.py uses them)

    name = (server_dtype or "auto").lower()
    if name != "auto":
        dtype = getattr(torch, name.removeprefix("torch."), None)
        if not isinstance(dtype, torch.dtype):
            raise ValueError(f"engine dtype: unknown dtype {server_dtype!r}")
        return dtype
    config_dtype = model_config.get("dtype") or model_config.get("torch_dtype") or "float32"
    dtype = getattr(torch, str(config_dtype).removeprefix("torch."))
    if dtype == torch.float32:
        return (
            torch.bfloat16 if str(model_config.get("model_type", "")).startswith("gemma") else torch.float16
        )
    return dtype


@dataclass
class EngineLink:
    """One engine: its client, its ranks in the update group, its dtype and session support."""

    client: EngineClient
    rank_offset: int
    tp_size: int
    dtype: torch.dtype
    _has_session: bool | None = field(default=None, repr=False)

    @property
    def url(self) -> str:
        return self.client.url

    async def begin_session(self, lanes: EngineLanes) -> None:
        """Open an update session where the server has them; the first call probes."""
        if self._has_session is False:
            return
        try:
            await lanes.call(self.client, "POST", "/begin_weight_update", {})
        except EngineError as exc:
            if self._has_session is None and exc.status == 404:
                self._has_session = False  # an older server: updates need no session
                return
            if exc.status != 400 or STALE_SESSION not in str(exc):
                raise
            # a session left open by a sync that gave up before its begin was answered:
            # close it, then open ours
            await lanes.call(self.client, "POST", "/end_weight_update", {})
            await lanes.call(self.client, "POST", "/begin_weight_update", {})
        self._has_session = True

    async def end_session(self, lanes: EngineLanes) -> None:
        if self._has_session:
            await lanes.call(self.client, "POST", "/end_weight_update", {})

    async def pause_and_begin(self, lanes: EngineLanes) -> None:
        """Pause generation (PAUSE_MODE: running requests are retracted, not lost), then
        open the update session."""
        await lanes.call(self.client, "POST", "/pause_generation", {"mode": PAUSE_MODE})
        await self.begin_session(lanes)

    async def resume(self, lanes: EngineLanes) -> None:
        await lanes.call(self.client, "POST", "/continue_generation", {})

    async def end_and_resume(self, lanes: EngineLanes) -> None:
        """Close the update session and resume generation (resumed even if the close fails)."""
        try:
            await self.end_session(lanes)
        finally:
            await self.resume(lanes)

    @property
    def has_session(self) -> bool | None:
        """True/False once probed, None before the first update."""
        return self._has_session


def connect_engines(urls: list[str], tp_size: int, model_config: dict, timeout_s: float) -> list[EngineLink]:
    """Ask every engine its dtype (`/server_info`) and lay out the group's ranks.

    All engines are asked at once: this runs again when an engine is restarted, and the
    time to restore it would otherwise grow by a round trip per engine."""
    offsets, _ = group_layout([tp_size] * len(urls))
    clients = [EngineClient(url, timeout_s) for url in urls]
    with ThreadPoolExecutor(max(1, len(clients)), thread_name_prefix="engine-info") as pool:
        infos = list(pool.map(EngineClient.server_info, clients))  # the first failure, in order
    links = []
    for client, info, offset in zip(clients, infos, offsets, strict=True):
        served_tp = int(info.get("tp_size", tp_size))
        if served_tp != tp_size:
            raise ValueError(
                f"rollout.tp_size: {tp_size}, but engine {client.url} runs with tp_size {served_tp}"
            )
        links.append(EngineLink(client, offset, tp_size, resolve_dtype(info.get("dtype"), model_config)))
    return links


def common_dtype(links: list[EngineLink]) -> torch.dtype:
    """One broadcast reaches every engine, so all must hold the same dtype."""
    dtypes = {link.dtype for link in links}
    if len(dtypes) != 1:
        found = {link.url: str(link.dtype) for link in links}
        raise ValueError(
            f"engines hold weights in different dtypes ({found}); one broadcast cannot serve them"
        )
    return dtypes.pop()
