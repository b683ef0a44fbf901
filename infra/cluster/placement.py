"""Where each role runs: a pure layout (tested without Ray) and the Ray placement groups
made from it.

A layout has placement groups (`roles`, one per role, or only the trainer's when
colocated) and, per role, one `Slot` per process: the bundle it sits in and what the
process itself asks of that bundle. Separate roles ask for whole bundles; colocated
engines sit in a trainer bundle beside a trainer rank, each taking a share of its GPU.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field

from infra.config import ClusterConfig, RoleResources

# Colocated: the trainer rank and the engine on one GPU each hold half of it in Ray's books.
# Memory is shared by taking turns (the engine releases its weights and KV while training).
COLOCATED_GPU_SHARE = 0.5


@dataclass(frozen=True)
class RoleLayout:
    """One placement group: its bundles, in the order the code indexes them."""

    name: str
    bundles: list[dict[str, float]]
    strategy: str

    @property
    def cpus(self) -> float:
        return sum(b.get("CPU", 0.0) for b in self.bundles)

    @property
    def gpus(self) -> float:
        return sum(b.get("GPU", 0.0) for b in self.bundles)


@dataclass(frozen=True)
class Slot:
    """One process of a role: bundle `bundle` of placement group `group`, and its own request."""

    group: str
    bundle: int
    cpus: float
    gpus: float
    resources: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class PlacementLayout:
    roles: dict[str, RoleLayout]  # placement groups by name
    slots: dict[str, list[Slot]]  # processes by role ("trainer", "engines", "critic")

    @property
    def cpus(self) -> float:
        return sum(r.cpus for r in self.roles.values())

    @property
    def gpus(self) -> float:
        return sum(r.gpus for r in self.roles.values())

    @property
    def num_processes(self) -> int:
        return sum(len(s) for s in self.slots.values())


def _bundle(res: RoleResources) -> dict[str, float]:
    bundle: dict[str, float] = {"CPU": res.cpus_per_worker}
    if res.gpus_per_worker:
        bundle["GPU"] = res.gpus_per_worker
    bundle.update(res.resources)
    return bundle


def _whole(role: str, res: RoleResources) -> list[Slot]:
    return [
        Slot(role, i, res.cpus_per_worker, res.gpus_per_worker, dict(res.resources))
        for i in range(res.num_workers)
    ]


def _merged(a: dict[str, float], b: dict[str, float]) -> dict[str, float]:
    out = dict(a)
    for key, value in b.items():
        out[key] = out.get(key, 0.0) + value
    return out


def engine_hosts(num_trainers: int, num_engines: int) -> list[int]:
    """Trainer bundles that host the colocated engines, spread evenly: 4 ranks, 2 engines -> [0, 2]."""
    step = num_trainers // num_engines
    return [i * step for i in range(num_engines)]


def _colocated(cfg: ClusterConfig) -> PlacementLayout:
    trainer, engines = cfg.trainer, cfg.engines
    if engines.num_workers > trainer.num_workers:
        raise ValueError(
            f"cluster.colocate: {engines.num_workers} engines cannot share {trainer.num_workers} trainer bundles"
        )
    hosts = engine_hosts(trainer.num_workers, engines.num_workers)
    gpus = trainer.gpus_per_worker
    share = COLOCATED_GPU_SHARE if gpus else 1.0
    bundles, trainer_slots, engine_slots = [], [], []
    for i in range(trainer.num_workers):
        bundle = _bundle(trainer)
        mine = gpus * share if i in hosts else gpus
        trainer_slots.append(Slot("trainer", i, trainer.cpus_per_worker, mine, dict(trainer.resources)))
        if i in hosts:
            # the engine's own CPUs and custom resources are added; its GPU is the trainer's
            extra = {"CPU": engines.cpus_per_worker, **engines.resources}
            bundle = _merged(bundle, extra)
            engine_slots.append(
                Slot("trainer", i, engines.cpus_per_worker, gpus * (1 - share), dict(engines.resources))
            )
        bundles.append(bundle)
    role = RoleLayout("trainer", bundles, cfg.placement_strategy)
    return PlacementLayout({"trainer": role}, {"trainer": trainer_slots, "engines": engine_slots})


def plan_placement(cfg: ClusterConfig, critic: bool = False, engines: bool = True) -> PlacementLayout:
    """One placement group per role and one bundle per process; colocated, one shared group.

    With `critic`, the critic's ranks are a role of their own (never colocated). Without
    `engines` (the run attaches to running servers, `rollout.engine_urls`) no engine is placed.
    """
    own = [("trainer", cfg.trainer)] + ([("engines", cfg.engines)] if engines else [])
    own += [("critic", cfg.critic)] if critic else []
    for name, res in own:
        # Ray rejects all-zero bundles; a role must reserve something per process.
        if not res.cpus_per_worker and not res.gpus_per_worker and not any(res.resources.values()):
            raise ValueError(f"cluster.{name}: each worker needs cpus_per_worker or gpus_per_worker > 0")
    if cfg.colocate:
        if critic:
            raise ValueError("cluster.colocate: the critic's ranks cannot share the trainer's bundles")
        return _colocated(cfg)
    roles = {
        name: RoleLayout(name, [_bundle(res) for _ in range(res.num_workers)], cfg.placement_strategy)
        for name, res in own
    }
    return PlacementLayout(roles, {name: _whole(name, res) for name, res in own})


def bundle_order(locations: list[tuple[str, list[int]]]) -> list[int]:
    """Bundle indices sorted by node, then by first GPU: rank r goes to bundle order[r].

    `locations[i]` is (node address, GPU ids) of bundle i as Ray placed it. Ray numbers
    bundles in request order, not by where they landed; sorting keeps consecutive ranks
    (and an engine's tensor-parallel GPUs) on one node, in GPU order.
    """

    def key(i: int) -> tuple:
        node, gpu_ids = locations[i]
        return (node, min(gpu_ids) if gpu_ids else -1, i)

    return sorted(range(len(locations)), key=key)


def local_cluster_cpus(
    layout: PlacementLayout, requested: int | None, machine_cpus: int | None = None
) -> int:
    """CPUs a local Ray cluster advertises: all roles must fit even on a 2-core laptop.

    Ray CPUs are scheduling tokens, not cores; oversubscribing them is what lets the
    trainer and the engines overlap on a small machine (threads are capped per process).
    """
    needed = math.ceil(layout.cpus)
    if requested is not None:
        if requested < needed:
            raise ValueError(f"cluster.num_cpus={requested} is less than the {needed} CPUs the roles reserve")
        return requested
    return max(needed, machine_cpus or os.cpu_count() or 1)
