"""Where each role runs: a pure layout (tested without Ray) and the Ray placement groups
made from it."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

from infra.config import ClusterConfig, RoleResources


@dataclass(frozen=True)
class RoleLayout:
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
class PlacementLayout:
    roles: dict[str, RoleLayout]

    @property
    def cpus(self) -> float:
        return sum(r.cpus for r in self.roles.values())

    @property
    def gpus(self) -> float:
        return sum(r.gpus for r in self.roles.values())


def _bundles(res: RoleResources) -> list[dict[str, float]]:
    bundle: dict[str, float] = {"CPU": res.cpus_per_worker}
    if res.gpus_per_worker:
        bundle["GPU"] = res.gpus_per_worker
    return [dict(bundle) for _ in range(res.num_workers)]


def plan_placement(cfg: ClusterConfig) -> PlacementLayout:
    """One placement group per role, one bundle per process of the role."""
    roles = {
        "trainer": RoleLayout("trainer", _bundles(cfg.trainer), cfg.placement_strategy),
        "engines": RoleLayout("engines", _bundles(cfg.engines), cfg.placement_strategy),
    }
    for role in roles.values():
        empty = [i for i, b in enumerate(role.bundles) if not any(b.values())]
        if empty:
            # Ray rejects all-zero bundles; a role must reserve something per process.
            raise ValueError(f"cluster.{role.name}: each worker needs cpus_per_worker or gpus_per_worker > 0")
    return PlacementLayout(roles)


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
