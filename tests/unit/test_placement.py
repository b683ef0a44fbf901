import pytest

from infra.cluster.placement import local_cluster_cpus, plan_placement
from infra.config import ClusterConfig, RoleResources


def test_default_layout_one_bundle_per_process():
    layout = plan_placement(ClusterConfig())
    assert layout.roles["trainer"].bundles == [{"CPU": 1.0}, {"CPU": 1.0}]
    assert layout.roles["engines"].bundles == [{"CPU": 1.0}]
    assert layout.cpus == 3 and layout.gpus == 0


def test_gpu_layout():
    cfg = ClusterConfig(
        trainer=RoleResources(num_workers=4, cpus_per_worker=2, gpus_per_worker=1),
        engines=RoleResources(num_workers=2, cpus_per_worker=4, gpus_per_worker=2),
        placement_strategy="SPREAD",
    )
    layout = plan_placement(cfg)
    assert layout.roles["trainer"].bundles == [{"CPU": 2.0, "GPU": 1.0}] * 4
    assert layout.roles["engines"].bundles == [{"CPU": 4.0, "GPU": 2.0}] * 2
    assert layout.roles["engines"].strategy == "SPREAD"
    assert (layout.cpus, layout.gpus) == (16, 8)


def test_empty_bundle_is_refused():
    cfg = ClusterConfig(engines=RoleResources(num_workers=1, cpus_per_worker=0, gpus_per_worker=0))
    with pytest.raises(ValueError, match="cluster.engines"):
        plan_placement(cfg)


def test_local_cluster_advertises_enough_cpus():
    layout = plan_placement(ClusterConfig())
    assert local_cluster_cpus(layout, None, machine_cpus=2) == 3  # roles need 3, machine has 2
    assert local_cluster_cpus(layout, None, machine_cpus=16) == 16
    assert local_cluster_cpus(layout, 5, machine_cpus=2) == 5
    with pytest.raises(ValueError, match="cluster.num_cpus"):
        local_cluster_cpus(layout, 2, machine_cpus=2)
