"""GPU layouts on a real Ray cluster of two nodes with 4 fake GPUs each (ray.cluster_utils):
bundles ordered by node and GPU, tensor-parallel engines holding tp GPUs, colocated engines
on their trainer rank's GPU. Fake GPUs are Ray's bookkeeping only; no device is touched."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import ray
from ray.cluster_utils import Cluster

from infra.cluster.placement import plan_placement
from infra.cluster.ray_cluster import create_placement_groups, ordered_bundles, remove_groups, slot_options
from infra.config import ClusterConfig, RoleResources

pytestmark = pytest.mark.cluster


@pytest.fixture(scope="module")
def two_gpu_nodes() -> Iterator[list[str]]:
    # Each node would take 30% of the machine's memory for its object store; the probes
    # return a few bytes, so both nodes get Ray's smallest.
    store = 80 * 1024 * 1024
    cluster = Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": 4, "num_gpus": 4, "include_dashboard": False, "object_store_memory": store},
    )
    cluster.add_node(num_cpus=4, num_gpus=4, object_store_memory=store)
    try:
        ray.init(address=cluster.address, include_dashboard=False)
        cluster.wait_for_nodes()
        yield [n["NodeID"] for n in ray.nodes() if n["Alive"]]
    finally:
        ray.shutdown()
        cluster.shutdown()


@ray.remote
class Probe:
    def where(self) -> tuple[str, list[int]]:
        return ray.get_runtime_context().get_node_id(), sorted(int(g) for g in ray.get_gpu_ids())


def _place(cfg: ClusterConfig) -> tuple[dict, dict[str, list[tuple[str, list[int]]]]]:
    """Place one probe actor per slot; where each process of each role landed."""
    layout = plan_placement(cfg)
    groups = create_placement_groups(layout, timeout_s=180)  # a loaded 2-core machine starts actors slowly
    order = {name: ordered_bundles(groups[name], role.bundles) for name, role in layout.roles.items()}
    probes = {
        role: [Probe.options(**slot_options(groups, order, s)).remote() for s in slots]
        for role, slots in layout.slots.items()
    }
    where = {role: ray.get([p.where.remote() for p in actors]) for role, actors in probes.items()}
    for actors in probes.values():
        for actor in actors:
            ray.kill(actor)
    return groups, where


def test_ranks_follow_node_and_gpu_order_and_engines_span_tp(two_gpu_nodes):
    cfg = ClusterConfig(
        placement_strategy="SPREAD",  # Ray alternates nodes: bundle order alone would interleave them
        trainer=RoleResources(num_workers=4, cpus_per_worker=0.5, gpus_per_worker=1),
        engines=RoleResources(num_workers=2, cpus_per_worker=0.5, gpus_per_worker=2),
    )
    groups, where = _place(cfg)
    try:
        trainer, engines = where["trainer"], where["engines"]
        assert all(len(gpus) == 1 for _, gpus in trainer)
        # rank order is node order, then GPU order: ranks of one node are consecutive
        keys = [(node, gpus[0]) for node, gpus in trainer]
        assert keys == sorted(keys)
        assert len({node for node, _ in trainer}) == 2  # SPREAD used both nodes
        assert all(len(gpus) == 2 for _, gpus in engines)  # an engine with tp 2 holds 2 GPUs
        used = [(node, g) for node, gpus in trainer + engines for g in gpus]
        assert len(used) == len(set(used)) == 8  # every fake GPU once
    finally:
        remove_groups(groups)


def test_colocated_engine_shares_its_rank_gpu(two_gpu_nodes):
    cfg = ClusterConfig(
        colocate=True,
        trainer=RoleResources(num_workers=4, cpus_per_worker=0.5, gpus_per_worker=1),
        engines=RoleResources(num_workers=2, cpus_per_worker=0.5, gpus_per_worker=1),
    )
    groups, where = _place(cfg)
    try:
        trainer, engines = where["trainer"], where["engines"]
        assert len({(node, gpus[0]) for node, gpus in trainer}) == 4  # one GPU per rank
        # engine i sits on trainer rank 2i's GPU (engine_hosts(4, 2) == [0, 2])
        assert engines == [trainer[0], trainer[2]]
    finally:
        remove_groups(groups)
