"""Connecting to Ray and turning a placement layout into placement groups."""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from types import ModuleType

import ray
from ray.util.placement_group import PlacementGroup, placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from infra.cluster.placement import PlacementLayout, Slot, bundle_order, local_cluster_cpus, plan_placement
from infra.config import RunConfig
from infra.secrets import SECRET_ENV

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


CODE_PACKAGES = ("infra", "flows", "tasks")
# The runtime env of the control work (Prefect task runs on Ray, infra/cluster/control_workers.py):
# the marker tells their processes apart; the job's env (code path, API URL) still applies
# underneath (Ray merges an actor's env_vars into the job's).
CONTROL_RUNTIME_ENV = {"env_vars": {"PRL_CONTROL_WORKER": "1"}}
# tasks whose events a local cluster's GCS keeps (`ray list tasks` shows the most recent)
TASK_EVENTS_KEPT = 5000


def code_modules() -> list[ModuleType]:
    """The project's packages, shipped to every node of an existing cluster."""
    return [importlib.import_module(name) for name in CODE_PACKAGES]


def runtime_env(address: str, env: Mapping[str, str]) -> dict:
    """How Ray workers find the code and the run's environment.

    A local cluster shares this machine's files: the repository goes on PYTHONPATH (no
    upload). An existing cluster gets the packages through `py_modules`: Ray uploads them
    once per content hash and every worker on every node imports them from its own copy,
    so no shared file system or pre-installed checkout is needed.

    Secrets in `env` (`SECRET_ENV`) are left out of `env_vars`; `secrets_hook` carries them.
    """
    env_vars = {k: v for k, v in env.items() if k not in SECRET_ENV}
    renv: dict = {"env_vars": env_vars}
    hook = secrets_hook(env)
    if hook is not None:
        renv["worker_process_setup_hook"] = hook
    if not address:
        env_vars["PYTHONPATH"] = os.pathsep.join(filter(None, [REPO_ROOT, os.environ.get("PYTHONPATH")]))
        return renv
    return {**renv, "py_modules": code_modules()}


def secrets_hook(env: Mapping[str, str]) -> Callable[[], None] | None:
    """A worker setup hook that puts the secrets of `env` into the worker's environment."""
    values = {k: v for k, v in env.items() if k in SECRET_ENV and v}
    if not values:
        return None

    # a closure, so Ray pickles it by value (the values with it) into the GCS, never a file
    def set_run_secrets() -> None:
        os.environ.update(values)

    return set_run_secrets


def _custom_resources(layout: PlacementLayout) -> dict[str, float]:
    total: dict[str, float] = {}
    for role in layout.roles.values():
        for bundle in role.bundles:
            for key, value in bundle.items():
                if key not in ("CPU", "GPU"):
                    total[key] = total.get(key, 0.0) + value
    return total


def connect(address: str, layout: PlacementLayout, num_cpus: int | None, env: Mapping[str, str]) -> bool:
    """Join or start Ray; returns True when this process started the cluster (and must stop it).

    `env` reaches every worker: Prefect tasks running on Ray workers need the API URL of
    the run, and the code must be importable there.

    Without `address` the run starts a private cluster whatever else runs on the machine:
    Ray's default would join the cluster named by RAY_ADDRESS or by the last `ray start`
    (its current-cluster file, even when that cluster is gone) and then refuse the local
    cluster's settings. Only `address` joins another cluster.
    """
    if ray.is_initialized():
        return False
    renv = runtime_env(address, env)
    if address:
        ray.init(address=address, runtime_env=renv, namespace="prefect-rl")
    else:
        # The run's processes must not see another cluster's address either: a Ray call
        # without one (a library's, a tool's) would join that cluster.
        os.environ.pop("RAY_ADDRESS", None)
        ray.init(
            address="local",
            num_cpus=local_cluster_cpus(layout, num_cpus),
            # custom resources the roles ask for: a local cluster has them all on one node
            resources=_custom_resources(layout) or None,
            runtime_env=renv,
            namespace="prefect-rl",
            include_dashboard=False,
            # the demo moves kilobytes per iteration; a small store keeps memory low
            object_store_memory=256 * 1024 * 1024,
            log_to_driver=True,
            # Ray kills idle workers beyond this many processes, actors included; the control
            # tasks' warm workers must survive between iterations or every task cold-starts.
            # Ray also prestarts one worker per CPU for the first driver, without a runtime
            # env; every task and actor of a run has one (the job's), so none would ever be
            # used: on 2 cores their start costs about a CPU-second of everyone's start-up.
            _system_config={
                "num_workers_soft_limit": layout.num_processes + 4,
                "prestart_worker_first_driver": False,
                # The GCS keeps the events of the last N tasks for Ray's state API (100k by
                # default); with a dozen Ray tasks an iteration (task runs, actor calls) it grew
                # ~45 KiB an iteration for thousands of iterations (bench.memory_growth).
                "task_events_max_num_task_in_gcs": TASK_EVENTS_KEPT,
            },
        )
    return True


def connect_ray(cfg: RunConfig, env: Mapping[str, str]) -> bool:
    """`connect` for a run: the local cluster sized for the run's placement."""
    layout = plan_placement(cfg.cluster, critic=cfg.critic.enabled, engines=not cfg.rollout.engine_urls)
    return connect(cfg.cluster.ray_address, layout, cfg.cluster.num_cpus, env)


@contextmanager
def ray_session(cfg: RunConfig, env: Mapping[str, str]) -> Iterator[None]:
    """Ray for the run, started before the flow (beside other start-up work) and stopped
    after it: a run's `RLSystem` then uses the cluster as it finds it."""
    owns = connect_ray(cfg, env)
    try:
        yield
    finally:
        if owns and ray.is_initialized():
            ray.shutdown()


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


def _where_am_i() -> tuple[str, list[int]]:
    ctx = ray.get_runtime_context()
    node = f"{ray.util.get_node_ip_address()}/{ctx.get_node_id()}"
    return node, sorted(int(g) for g in ray.get_gpu_ids())


def ordered_bundles(pg: PlacementGroup, bundles: list[dict[str, float]]) -> list[int]:
    """Bundle indices ordered by node and GPU (see `bundle_order`).

    Only GPU bundles are probed, by a tiny task holding each bundle's GPUs: CPU bundles
    have no device order worth a task start per bundle, so they keep Ray's numbering.
    """
    if not any(b.get("GPU") for b in bundles):
        return list(range(len(bundles)))
    probe = ray.remote(_where_am_i)
    refs = [
        probe.options(num_cpus=0, num_gpus=b.get("GPU", 0), scheduling_strategy=in_bundle(pg, i)).remote()
        for i, b in enumerate(bundles)
    ]
    return bundle_order(ray.get(refs))


def slot_options(groups: Mapping[str, PlacementGroup], order: Mapping[str, list[int]], slot: Slot) -> dict:
    """`.options(...)` of the actor that fills `slot`."""
    return {
        "num_cpus": slot.cpus,
        "num_gpus": slot.gpus,
        "resources": dict(slot.resources) or None,
        "scheduling_strategy": in_bundle(groups[slot.group], order[slot.group][slot.bundle]),
    }


def bundle_nodes(pg: PlacementGroup) -> list[str]:
    """Node id of each bundle (for logs and tests)."""
    from ray.util import placement_group_table

    table = placement_group_table(pg)["bundles_to_node_id"]
    return [table[i] for i in sorted(table)]


def remove_groups(groups: Mapping[str, PlacementGroup]) -> None:
    for pg in groups.values():
        remove_placement_group(pg)
