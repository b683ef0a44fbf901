"""A trainer rank stand-in for scale benches: it receives every batch as the real rank does
(staged from the rollout manager through Ray's object store), then waits a set time per
sample instead of training, and speaks the weight sync's HTTP part to the engines.

Selected by `cluster.trainer_class=bench.sim_trainer:SimTrainerRank`; its times come from the
environment (Ray workers of a local cluster inherit the driver's), as JSON in
`PRL_SIM_TRAINER`: `{"s_per_sample": 0.0005, "sync_s": 0.2}`.

A weight sync posts what rank 0 of the broadcast transport posts to every engine, and as it
does (`BroadcastSender`): one lane per engine runs that engine's requests in order, all lanes
on one event loop (infra/engines/lanes.py), so every engine's request is in flight at once:
/pause_generation (retract) and /begin_weight_update; then one
/update_weights_from_distributed naming the new version, in flight while `sync_s` passes for
the broadcast itself (no tensor is sent; a real engine answers it once the broadcast has
arrived); then /end_weight_update and /continue_generation.
Checkpoints are a small JSON file per rank, so saves and their commit run as in a real run.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import Future
from typing import ClassVar

import ray

from infra.config import RunConfig
from infra.engines.client import EngineClient, weights_update_body
from infra.engines.lanes import EngineLanes
from infra.rollout.batch import RolloutBatch
from infra.storage.fs import filesystem
from infra.trainer.batch_inbox import BatchInbox, FromManager
from infra.weights.engines import EngineLink

ENV = "PRL_SIM_TRAINER"


def sim_settings() -> dict[str, float]:
    return {"s_per_sample": 0.0, "sync_s": 0.0, **json.loads(os.environ.get(ENV) or "{}")}


class SimTrainerRank:
    CONCURRENCY_GROUPS: ClassVar[dict[str, int]] = {"stage": 1, "restore": 1}

    def __init__(self, cfg: RunConfig, rank: int, world_size: int) -> None:
        self.cfg, self.rank, self.world_size = cfg, rank, world_size
        self.settings = sim_settings()
        self.inbox = BatchInbox()
        # kept, as the real rank keeps its engine links, with their lanes (one tuple: a sync
        # reads both at once while connect_engines may replace them)
        self.fanout: tuple[list[EngineLink], EngineLanes | None] = ([], None)
        self.group = ""
        self.version = "0"

    # -- what RLSystem and the run handles call on every trainer rank -------------------
    def master_address(self) -> tuple[str, int]:
        return "127.0.0.1", 0  # no process group: nothing meets there

    def setup(self, model_uri: str, storage_options: dict, master_addr: str, master_port: int) -> None:
        pass

    def pid(self) -> int:
        return os.getpid()

    @ray.method(concurrency_group="stage")
    def stage_batch(self, rollout_id: int, source: FromManager) -> None:
        self.inbox.announce(rollout_id)
        staged = None
        try:
            staged = source.fetch(rollout_id)
        finally:
            self.inbox.put(rollout_id, staged)

    @ray.method(concurrency_group="stage")
    def inbox_state(self) -> dict:
        return self.inbox.state()

    def train(self, rollout_id: int, batch: RolloutBatch | FromManager, values=None, mailbox=None) -> dict:
        received = time.perf_counter()
        batch = self.inbox.take(rollout_id, batch)
        start = time.perf_counter()
        time.sleep(len(batch.samples) * self.settings["s_per_sample"])
        return {
            "rollout_id": rollout_id,
            # the keys the train task logs (tasks/train.py); nothing was trained
            "loss": 0.0,
            "grad_norm": 0.0,
            "pg_clipfrac": 0.0,
            "kl": 0.0,
            "train_engine_logprob_abs_diff": 0.0,
            "time_train_s": time.perf_counter() - start,
            "time_batch_wait_s": start - received,
            "checkpoint_writing": False,
        }

    # -- weight sync (rank 0 talks to the engines) ---------------------------------------
    @ray.method(concurrency_group="restore")
    def connect_engines(self, engine_urls: list[str]) -> None:
        # the previous lanes are not closed here: a sync may still be using them (this runs
        # beside it, in the restore group)
        timeout = self.cfg.weight_sync.timeout_s
        links = [
            EngineLink(EngineClient(url, timeout), 1, 1, None) for url in engine_urls
        ]  # no dtype: no tensors
        self.fanout = (links, EngineLanes(len(links)) if self.rank == 0 and links else None)

    def _submit(self, fn: Callable[[EngineLink], Awaitable[None]]) -> list[Future]:
        links, lanes = self.fanout
        if lanes is None:
            return []
        return [lanes.submit(i, fn, link) for i, link in enumerate(links)]

    def _each(self, fn: Callable[[EngineLink], Awaitable[None]]) -> None:
        for request in self._submit(fn):
            request.result()  # an engine's failure names its URL (EngineError)

    def open_weight_group(self, group_name: str) -> None:
        self.group = group_name
        world = len(self.fanout[0]) + 1
        join = EngineClient.init_weights_update_group  # once a run: the client's own call will do
        self._each(lambda link: asyncio.to_thread(join, link.client, "127.0.0.1", 0, 1, world, group_name))

    def update_weights(self, weight_version: int) -> dict:
        start = time.perf_counter()
        version = str(weight_version)
        lanes = self.fanout[1]

        def announce(link: EngineLink) -> Awaitable:
            body = weights_update_body(["sim"], ["float32"], [[1]], self.group, weight_version=version)
            return lanes.call(link.client, "POST", "/update_weights_from_distributed", body)

        self._each(lambda link: link.pause_and_begin(lanes))
        posts = self._submit(announce)
        if self.rank == 0:
            time.sleep(self.settings["sync_s"])  # the broadcast this stand-in does not make
        for post in posts:
            post.result()
        self._each(lambda link: link.end_and_resume(lanes))
        self.version = version
        return {"time_sync_s": time.perf_counter() - start, "num_buckets": 1, "bytes": 0}

    @ray.method(concurrency_group="restore")
    def restore_engines(self, engine_urls: list[str], group_name: str) -> str:
        self.connect_engines(engine_urls)
        self.open_weight_group(group_name)
        self.update_weights(int(self.version))
        return self.version

    @ray.method(concurrency_group="restore")
    def close_weight_group(self) -> None:
        leave = EngineClient.destroy_weights_update_group
        self._each(lambda link: asyncio.to_thread(leave, link.client, self.group))

    def check_weights_equal(self) -> dict:
        return {"weight_check": "simulated: not compared"}

    # -- checkpoints ----------------------------------------------------------------------
    def save_checkpoint(self, path: str, storage_options: dict, background: bool = False) -> None:
        fs, root = filesystem(path, storage_options)
        fs.makedirs(root, exist_ok=True)
        with fs.open(f"{root}/sim_rank{self.rank}.json", "w") as f:
            json.dump({"rank": self.rank, "weight_version": self.version}, f)

    def finish_checkpoint(self) -> str | None:
        return None

    def load_checkpoint(self, path: str, storage_options: dict) -> None:
        pass

    def export_hf(self, uri: str, storage_options: dict, merged: bool = False) -> None:
        pass

    def shutdown(self) -> None:
        links, lanes = self.fanout
        if lanes is not None:
            lanes.close()
        for link in links:
            link.client.close()
