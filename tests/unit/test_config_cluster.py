"""Cluster fields: colocated mode and per-role custom resources."""

import pytest
from pydantic import ValidationError

from infra.config import RunConfig


def test_colocate_refuses_async_naming_both_fields():
    with pytest.raises(ValidationError) as err:
        RunConfig.model_validate({"mode": "async", "cluster": {"colocate": True}})
    assert "cluster.colocate" in str(err.value) and "mode=sync" in str(err.value)
    assert RunConfig.model_validate({"mode": "sync", "cluster": {"colocate": True}}).cluster.colocate


def test_colocate_shape_checks():
    base = {"mode": "sync", "cluster": {"colocate": True}}
    with pytest.raises(ValidationError, match="cluster.engines.num_workers=3 must not exceed"):
        RunConfig.model_validate({**base, "cluster": {"colocate": True, "engines": {"num_workers": 3}}})
    gpu = {
        "colocate": True,
        "trainer": {"num_workers": 2, "gpus_per_worker": 1},
        "engines": {"num_workers": 1, "gpus_per_worker": 2},
    }
    disk = {"weight_sync": {"method": "disk"}}
    with pytest.raises(ValidationError, match="rollout.tp_size=2 is not supported colocated"):
        RunConfig.model_validate(
            {**base, **disk, "cluster": gpu, "rollout": {"engine": "sglang", "tp_size": 2}}
        )
    one_gpu = {**gpu, "engines": {"gpus_per_worker": 1}}
    with pytest.raises(ValidationError, match="needs weight_sync.method=disk"):
        RunConfig.model_validate({**base, "cluster": one_gpu})
    assert RunConfig.model_validate({**base, **disk, "cluster": one_gpu}).cluster.colocate


def test_role_resources_are_a_dict_of_numbers():
    cfg = RunConfig.model_validate({"cluster": {"trainer": {"resources": {"trainer_node": 1}}}})
    assert cfg.cluster.trainer.resources == {"trainer_node": 1.0}
    with pytest.raises(ValidationError, match="cluster.engines.resources"):
        RunConfig.model_validate({"cluster": {"engines": {"resources": {"x": "many"}}}})


def test_setting_one_trainer_field_keeps_the_default_ranks():
    cfg = RunConfig.model_validate({"cluster": {"trainer": {"resources": {"trainer_node": 1}}}})
    assert cfg.cluster.trainer.num_workers == 2
