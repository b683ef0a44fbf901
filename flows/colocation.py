"""Whether engines and trainer have devices of their own or take turns on the trainer's
(`cluster.colocate`), and what that allows the loop around each iteration's training: the
flow asks this object, so its loop is one loop for both.

With devices of their own, the engines keep their memory, and the weight sync and the next
iteration's training are submitted ahead: Ray starts each task run as its upstream ends,
without waiting for the flow (flows/ahead.py). Colocated (sync mode only, nothing in
flight), the engines give the trainer the devices while it trains and take them back before
the weight sync refills them; that is the flow's doing, between training and sync, so
nothing is submitted ahead.
"""

from __future__ import annotations

from typing import Protocol

from infra.config import RunConfig
from infra.schedule import LoopSchedule


class EngineMemory(Protocol):
    def release_engines(self) -> dict: ...
    def resume_engines(self) -> dict: ...


class OwnDevices:
    def __init__(self, schedule: LoopSchedule, generates_ahead: bool) -> None:
        self._schedule = schedule
        self._generates_ahead = generates_ahead

    def release_engines(self, run: EngineMemory) -> dict:
        return {}

    def resume_engines(self, run: EngineMemory) -> dict:
        return {}

    def sync_ahead(self, k: int) -> bool:
        """Submit the sync after iteration k while k trains (Ray starts it after the training)?"""
        return self._schedule.sync_after(k)

    def train_ahead(self, k: int) -> bool:
        """Submit the training of k+1 during k? Only with its batch generated ahead (async mode)."""
        return self._generates_ahead and self._schedule.train_ahead(k)

    def generate_behind_sync(self, k: int) -> int | None:
        """The rollout whose generate is submitted behind the sync after k, to start as that
        sync ends: k+2 in async mode (k+1 is in flight), k+1 in sync mode; None where the
        schedule does not allow it."""
        upcoming = k + 2 if self._generates_ahead else k + 1
        return upcoming if self._schedule.generate_behind_sync(k, upcoming) else None


class SharedDevices:
    def release_engines(self, run: EngineMemory) -> dict:
        return run.release_engines()

    def resume_engines(self, run: EngineMemory) -> dict:
        return run.resume_engines()

    def sync_ahead(self, k: int) -> bool:
        return False  # the engines first get their devices back

    def train_ahead(self, k: int) -> bool:
        return False

    def generate_behind_sync(self, k: int) -> int | None:
        return None


def colocation(config: RunConfig, schedule: LoopSchedule) -> OwnDevices | SharedDevices:
    if config.cluster.colocate:
        return SharedDevices()
    return OwnDevices(schedule, generates_ahead=config.mode == "async")
