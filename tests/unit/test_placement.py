import pytest

from infra.cluster.placement import bundle_order, engine_hosts, local_cluster_cpus, plan_placement
from infra.config import ClusterConfig, RoleResources


def test_default_layout_one_bundle_per_process():
    layout = plan_placement(ClusterConfig())
    assert layout.roles["trainer"].bundles == [{"CPU": 1.0}, {"CPU": 1.0}]
    assert layout.roles["engines"].bundles == [{"CPU": 1.0}]
    assert layout.cpus == 3 and layout.gpus == 0


def test_critic_is_a_role_of_its_own_only_when_enabled():
    assert "critic" not in plan_placement(ClusterConfig()).slots
    cfg = ClusterConfig(critic=RoleResources(num_workers=2, cpus_per_worker=1, gpus_per_worker=1))
    layout = plan_placement(cfg, critic=True)
    assert layout.roles["critic"].bundles == [{"CPU": 1.0, "GPU": 1.0}] * 2
    assert [(s.group, s.bundle) for s in layout.slots["critic"]] == [("critic", 0), ("critic", 1)]
    assert layout.num_processes == 5 and layout.gpus == 2
    assert ClusterConfig.model_validate({"critic": {"cpus_per_worker": 2}}).critic.num_workers == 2
    with pytest.raises(ValueError, match="cluster.critic"):
        plan_placement(ClusterConfig(critic=RoleResources(cpus_per_worker=0)), critic=True)
    with pytest.raises(ValueError, match="critic"):
        plan_placement(ClusterConfig(colocate=True), critic=True)


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


def test_every_process_has_its_own_bundle_when_separate():
    cfg = ClusterConfig(
        trainer=RoleResources(num_workers=2, gpus_per_worker=1, resources={"trainer_node": 1}),
        engines=RoleResources(num_workers=1, gpus_per_worker=2, resources={"engine_node": 1}),
    )
    layout = plan_placement(cfg)
    assert layout.roles["trainer"].bundles == [{"CPU": 1.0, "GPU": 1.0, "trainer_node": 1}] * 2
    assert layout.roles["engines"].bundles == [{"CPU": 1.0, "GPU": 2.0, "engine_node": 1}]
    assert [(s.group, s.bundle, s.gpus, s.resources) for s in layout.slots["trainer"]] == [
        ("trainer", 0, 1.0, {"trainer_node": 1}),
        ("trainer", 1, 1.0, {"trainer_node": 1}),
    ]
    assert [(s.group, s.bundle, s.gpus) for s in layout.slots["engines"]] == [("engines", 0, 2.0)]
    assert layout.num_processes == 3


def test_colocated_engines_share_trainer_bundles():
    cfg = ClusterConfig(
        colocate=True,
        trainer=RoleResources(num_workers=4, cpus_per_worker=2, gpus_per_worker=1),
        engines=RoleResources(num_workers=2, cpus_per_worker=1, gpus_per_worker=1, resources={"x": 1}),
    )
    layout = plan_placement(cfg)
    assert list(layout.roles) == ["trainer"]  # one placement group for both roles
    bundles = layout.roles["trainer"].bundles
    assert bundles[0] == bundles[2] == {"CPU": 3.0, "GPU": 1.0, "x": 1}
    assert bundles[1] == bundles[3] == {"CPU": 2.0, "GPU": 1.0}
    engines = layout.slots["engines"]
    assert [(s.group, s.bundle) for s in engines] == [("trainer", 0), ("trainer", 2)]
    # each bundle's GPU is split between its rank and its engine, never oversubscribed
    for i, bundle in enumerate(bundles):
        asked = [s for role in layout.slots.values() for s in role if s.bundle == i]
        assert sum(s.gpus for s in asked) == bundle["GPU"]
        assert sum(s.cpus for s in asked) == bundle["CPU"]
    assert (layout.cpus, layout.gpus) == (10, 4)


def test_colocated_on_cpu_default_shapes():
    layout = plan_placement(ClusterConfig(colocate=True))
    assert layout.roles["trainer"].bundles == [{"CPU": 2.0}, {"CPU": 1.0}]
    assert [(s.bundle, s.cpus, s.gpus) for s in layout.slots["engines"]] == [(0, 1.0, 0.0)]
    assert local_cluster_cpus(layout, None, machine_cpus=2) == 3


def test_colocated_needs_enough_trainer_bundles():
    cfg = ClusterConfig(colocate=True, engines=RoleResources(num_workers=3))
    with pytest.raises(ValueError, match="cluster.colocate"):
        plan_placement(cfg)


def test_bundle_order_is_by_node_then_gpu():
    # as Ray might number them: bundle 0 landed on node b, GPU 2, ...
    locations = [("b", [2]), ("a", [1]), ("b", [0]), ("a", [0]), ("a", [3, 2]), ("b", [])]
    order = bundle_order(locations)
    assert [locations[i] for i in order] == [
        ("a", [0]),
        ("a", [1]),
        ("a", [3, 2]),
        ("b", []),
        ("b", [0]),
        ("b", [2]),
    ]
    assert engine_hosts(4, 2) == [0, 2] and engine_hosts(2, 1) == [0] and engine_hosts(3, 3) == [0, 1, 2]
