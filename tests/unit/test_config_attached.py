"""rollout.engine_urls (attach to running engine servers) and cluster.trainer_class."""

import pytest
from pydantic import ValidationError

from infra.cluster.placement import plan_placement
from infra.config import RunConfig


def test_engine_urls_parse_and_place_no_engines():
    urls = ["http://127.0.0.1:30000", "https://engine-1.example:8443/"]
    cfg = RunConfig.model_validate({"rollout": {"engine_urls": urls}})
    assert cfg.rollout.engine_urls == urls
    assert RunConfig().rollout.engine_urls == []
    layout = plan_placement(cfg.cluster, engines=not cfg.rollout.engine_urls)
    assert "engines" not in layout.roles and "engines" not in layout.slots
    assert "engines" in plan_placement(cfg.cluster).roles


@pytest.mark.parametrize("url", ["127.0.0.1:30000", "ftp://host:1", "http://", "http://host:1/generate"])
def test_engine_urls_refuse_what_is_not_a_base_url(url):
    with pytest.raises(ValidationError, match="rollout.engine_urls"):
        RunConfig.model_validate({"rollout": {"engine_urls": [url]}})


def test_engine_urls_refuse_duplicates_and_what_needs_engine_actors():
    with pytest.raises(ValidationError, match="appears twice"):
        RunConfig.model_validate({"rollout": {"engine_urls": ["http://a:1", "http://a:1"]}})
    attached = {"rollout": {"engine_urls": ["http://a:1"]}}
    with pytest.raises(ValidationError, match="weight_sync.method=broadcast"):
        RunConfig.model_validate({**attached, "weight_sync": {"method": "disk"}})
    with pytest.raises(ValidationError, match="cluster.colocate"):
        RunConfig.model_validate({**attached, "mode": "sync", "cluster": {"colocate": True}})


def test_trainer_class_is_a_module_and_name():
    assert RunConfig().cluster.trainer_class == ""
    spec = "bench.sim_trainer:SimTrainerRank"
    assert RunConfig.model_validate({"cluster": {"trainer_class": spec}}).cluster.trainer_class == spec
    for bad in ("bench.sim_trainer.SimTrainerRank", ":SimTrainerRank", "bench.sim_trainer:"):
        with pytest.raises(ValidationError, match="cluster.trainer_class"):
            RunConfig.model_validate({"cluster": {"trainer_class": bad}})
