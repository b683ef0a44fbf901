"""Connecting to Ray and turning a placement layout into placement groups."""

from __future__ import annotations

import os
from collections.abc import Mapping

import ray
from ray.util.placement_group import PlacementGroup, placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from infra.cluster.placement import PlacementLayout, local_cluster_cpus

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def connect(address: str, layout: PlacementLayout, num_cpus: int | None, env: Mapping[str, str]) -> bool:
    """Join or start Ray; returns True when this process started the cluster (and must stop it).

    `env` reaches every worker: Prefect tasks running on Ray workers need the API URL of
    the run, and the code must be importable there.
    """
    if ray.is_initialized():
        return False
    env_vars = {"PYTHONPATH": os.pathsep.join(filter(None, [REPO_ROOT, os.environ.get("PYTHONPATH")]))}
    env_vars.update(env)
    runtime_env = {"env_vars": env_vars}
    if address:
        ray.init(address=address, runtime_env=runtime_env, namespace="prefect-rl")
    else:
        ray.init(
            num_cpus=local_cluster_cpus(layout, num_cpus),
            runtime_env=runtime_env,
            namespace="prefect-rl",
            include_dashboard=False,
            # the demo moves kilobytes per iteration; a small store keeps memory low
            object_store_memory=256 * 1024 * 1024,
            log_to_driver=True,
            # Ray kills idle workers beyond this many processes, actors included; the control
            # tasks' warm workers must survive between iterations or every task cold-starts.
            _system_config={
                "num_workers_soft_limit": len(layout.roles["trainer"].bundles)
                + len(layout.roles["engines"].bundles)
                + 4
            },
        )
    return True


def create_placement_groups(layout: PlacementLayout, timeout_s: float = 120) -> dict[str, PlacementGroup]:
    groups = {
        name: placement_group(role.bundles, strategy=role.strategy) for name, role in layout.roles.items()
    }
    for name, pg in groups.items():
        ready, _ = ray.wait([pg.ready()], timeout=timeout_s)
        if not ready:
            raise TimeoutError(
                f"placement group '{name}' ({layout.roles[name].bundles}) not ready after {timeout_s}s: "
                f"the cluster has {ray.available_resources()}"
            )
    return groups


def in_bundle(pg: PlacementGroup, index: int) -> PlacementGroupSchedulingStrategy:
    return PlacementGroupSchedulingStrategy(placement_group=pg, placement_group_bundle_index=index)


def remove_groups(groups: Mapping[str, PlacementGroup]) -> None:
    for pg in groups.values():
        remove_placement_group(pg)


def _import_and_wait(modules: list[str], seconds: float) -> int:
    import importlib
    import time

    for name in modules:
        importlib.import_module(name)
    time.sleep(seconds)  # hold this worker so the next warm-up lands on another one
    return os.getpid()


def warm_workers(count: int, modules: list[str]) -> list[ray.ObjectRef]:
    """Start `count` idle workers with `modules` imported, without waiting for them.

    The loop runs generate(k+1) and train(k) at the same time on two workers; a cold
    worker spends seconds importing Prefect, which would serialize the first iterations.
    """
    task = ray.remote(num_cpus=0)(_import_and_wait)
    return [task.remote(modules, 1.0) for _ in range(count)]
