"""Weight transport: how the trainer's weights reach the rollout engines, as one small
interface with two implementations, chosen by `weight_sync.method`.

- `broadcast`: trainer rank 0 and every engine rank form a weight-update group; the
  trainer ranks gather full tensors bucket by bucket and rank 0 broadcasts them.
- `disk`: the trainer exports an HF directory per version to the run's storage (local or
  s3://); each engine's actor makes it local on its own node and posts the local path to
  its server's `/update_weights_from_disk`. Older exports are then deleted.
- with a LoRA adapter (`model.lora`): `weight_sync.lora=merged` sends full weights with the
  adapter merged in, through either of the above; `adapter` sends only the adapter
  (`AdapterTransport`).

The driver holds a transport (it travels with the run handles to the Prefect tasks);
the state it drives lives in the trainer and engine actors, so copies of it are harmless.
"""

from __future__ import annotations

import uuid
from abc import ABC, abstractmethod
from dataclasses import dataclass

import ray

from infra.cluster.rank_group import RankGroup
from infra.config import RunConfig
from infra.storage.fs import RunStore, storage_options

EXPORTS = "weights"
ADAPTERS = "adapters"  # weight_sync.lora=adapter: one PEFT adapter directory per version


def group_name_for(run_name: str) -> str:
    """Unique per run (and per start of it): a stale group of an earlier run never matches."""
    return f"prl-{run_name}-{uuid.uuid4().hex[:8]}"


def export_rel(version: int, folder: str = EXPORTS) -> str:
    return f"{folder}/v{version:07d}"


def adapter_name(version: int) -> str:
    """The name engines load adapter `version` under: a new one per version (SGLang cannot
    replace a loaded adapter in place)."""
    return f"v{version:07d}"


@dataclass
class WeightTransport(ABC):
    cfg: RunConfig
    trainers: RankGroup
    engines: list
    engine_urls: list[str]

    def __post_init__(self) -> None:
        if not isinstance(self.trainers, RankGroup):
            self.trainers = RankGroup(self.trainers, "trainer")

    def open(self) -> None:
        """Connect the trainer to the engines (before the first push)."""
        self.trainers.call("connect_engines", self.engine_urls)

    @abstractmethod
    def push(self, version: int) -> dict:
        """Bring every engine to the trainer's weights, tagged `version`; small stats back."""

    @abstractmethod
    def restore(self, engine_urls: list[str], index: int) -> str:
        """Bring restarted engine `index` (now at `engine_urls[index]`) back to the weights
        of the last push, while the trainer may be training; returns their version."""

    def close(self) -> None:  # noqa: B027 - nothing to tear down unless a transport built it
        """Tear down what `open` built; safe to call more than once."""


@dataclass
class BroadcastTransport(WeightTransport):
    group_name: str = ""

    def open(self) -> None:
        super().open()
        self.trainers.call("open_weight_group", self.group_name)

    def push(self, version: int) -> dict:
        return self.trainers.rank0("update_weights", version, what="weight sync")

    def restore(self, engine_urls: list[str], index: int) -> str:
        # every engine joins a new group (fresh name): a group cannot take a new member
        name = group_name_for(self.cfg.run_name)
        return ray.get(self.trainers[0].restore_engines.remote(engine_urls, name))

    def close(self) -> None:
        ray.get(self.trainers.refs("close_weight_group"), timeout=120)


@dataclass
class DiskTransport(WeightTransport):
    def push(self, version: int) -> dict:
        store = RunStore(self.cfg.storage, self.cfg.run_name)
        opts = storage_options(self.cfg.storage)
        uri = store.uri(export_rel(version))
        self.trainers.call("export_hf", uri, opts, merged=True, what="weight export")
        ray.get([e.load_weights_from_disk.remote(uri, opts, str(version)) for e in self.engines])
        removed = remove_older_exports(store, version)
        return {"export_uri": uri, "exports_removed": removed}

    def restore(self, engine_urls: list[str], index: int) -> str:
        store = RunStore(self.cfg.storage, self.cfg.run_name)
        version = last_export(store, EXPORTS)
        opts = storage_options(self.cfg.storage)
        ray.get(
            self.engines[index].load_weights_from_disk.remote(
                store.uri(export_rel(version)), opts, str(version)
            )
        )
        ray.get(self.trainers[0].connect_engines.remote(engine_urls))  # the weight check's URLs
        return str(version)


@dataclass
class AdapterTransport(WeightTransport):
    """`weight_sync.lora=adapter`: only the LoRA adapter travels. Trainer rank 0 writes a PEFT
    adapter directory per version to the run's storage; every engine loads it under a new
    name; the rollout manager names it in every request from then on; then the previous
    version is unloaded on each engine without waiting (an unload waits for the
    generations still using it, and there are none: the sync runs between generations)."""

    manager: ray.actor.ActorHandle | None = None

    def push(self, version: int) -> dict:
        store = RunStore(self.cfg.storage, self.cfg.run_name)
        opts = storage_options(self.cfg.storage)
        uri = store.uri(export_rel(version, ADAPTERS))
        self.trainers.call("export_hf", uri, opts, what="adapter export")
        name = adapter_name(version)
        ray.get([e.load_lora_from_disk.remote(uri, opts, name) for e in self.engines])
        previous = ray.get(self.manager.use_adapter.remote(name, version))
        if previous is not None and previous != name:
            for engine in self.engines:
                engine.unload_lora.remote(previous)  # not waited for (see the class)
        removed = remove_older_exports(store, version, ADAPTERS)
        return {"adapter_uri": uri, "lora_adapter": name, "exports_removed": removed}

    def restore(self, engine_urls: list[str], index: int) -> str:
        # the manager keeps naming the current adapter: the restarted engine loads it again
        store = RunStore(self.cfg.storage, self.cfg.run_name)
        version = last_export(store, ADAPTERS)
        opts = storage_options(self.cfg.storage)
        uri = store.uri(export_rel(version, ADAPTERS))
        ray.get(self.engines[index].load_lora_from_disk.remote(uri, opts, adapter_name(version)))
        ray.get(self.trainers[0].connect_engines.remote(engine_urls))  # the weight check's URLs
        return str(version)


def _versions(store: RunStore, folder: str) -> list[int]:
    names = (entry.rstrip("/").rsplit("/", 1)[-1] for entry in store.ls(folder))
    return sorted(int(n[1:]) for n in names if n.startswith("v") and n[1:].isdigit())


def last_export(store: RunStore, folder: str) -> int:
    """The version of the last push: the only export kept (see `remove_older_exports`)."""
    versions = _versions(store, folder)
    if not versions:
        raise RuntimeError(f"weight restore: nothing in {folder}/ to load into the restarted engine")
    return versions[-1]


def remove_older_exports(store: RunStore, keep: int, folder: str = EXPORTS) -> int:
    """Delete every export but version `keep` (all engines have loaded it); returns how many."""
    removed = 0
    for version in _versions(store, folder):
        if version != keep:
            store.delete(export_rel(version, folder), recursive=True)
            removed += 1
    return removed


def make_transport(
    cfg: RunConfig,
    trainers: RankGroup,
    engines: list,
    engine_urls: list[str],
    manager: ray.actor.ActorHandle | None = None,
) -> WeightTransport:
    """The transport `weight_sync` selects; `manager` (the rollout manager) is told the adapter
    to name in requests when only a LoRA adapter is sent."""
    if cfg.model.lora is not None and cfg.weight_sync.lora == "adapter":
        return AdapterTransport(cfg, trainers, engines, engine_urls, manager)
    if cfg.weight_sync.method == "broadcast":
        return BroadcastTransport(cfg, trainers, engines, engine_urls, group_name_for(cfg.run_name))
    if cfg.weight_sync.method == "disk":
        return DiskTransport(cfg, trainers, engines, engine_urls)
    raise ValueError(f"weight_sync.method: unknown method {cfg.weight_sync.method!r} (broadcast or disk)")
