"""Weight transports through the whole system on a local Ray cluster (no Prefect): two
engines, one trainer rank, a real train step, then syncs with the weight check on."""

from __future__ import annotations

import pytest
import ray

from infra.config import RunConfig
from infra.engines.client import EngineClient
from infra.storage.fs import RunStore
from infra.system import RLSystem

pytestmark = pytest.mark.dist


def _cfg(uri: str, method: str) -> RunConfig:
    return RunConfig.model_validate(
        {
            "run_name": f"wt-{method}",
            "rollout": {"prompts_per_rollout": 4, "n_samples_per_prompt": 2},
            "cluster": {"trainer": {"num_workers": 1}, "engines": {"num_workers": 2}},
            "weight_sync": {"method": method, "check_weight_update_equal": True},
            "storage": {"uri": uri},
        }
    )


def _sync_after_a_step(cfg: RunConfig) -> tuple[dict, dict, list[str], object]:
    with RLSystem(cfg) as run:
        first = run.sync(0)
        run.generate(0)
        run.train(0)
        second = run.sync(1)  # the trained weights, which differ from the engines' start
        urls = ray.get(run.manager.engine_urls.remote())  # the engines' current addresses
        versions = [EngineClient(u).model_info()["weight_version"] for u in urls]
        transport = run.transport
    return first, second, versions, transport


@pytest.mark.s3
def test_disk_transport_on_s3(s3_bucket):
    """Exports go to the bucket; each engine's actor downloads its copy (local storage is
    covered beside the engine actor in tests/unit/test_weight_engines.py)."""
    cfg = _cfg(f"{s3_bucket}/runs", "disk")
    first, second, versions, _ = _sync_after_a_step(cfg)
    assert versions == ["1", "1"]
    assert second["weights_checked"] == 21 and second["max_abs_diff"] == 0.0
    assert second["values_checked"] > 0 and second["exports_removed"] == 1 and first["exports_removed"] == 0
    assert RunStore(cfg.storage, cfg.run_name).ls("weights") == ["v0000001"]  # older versions go


def test_broadcast_transport_two_engines(tmp_path):
    first, second, versions, transport = _sync_after_a_step(_cfg(str(tmp_path), "broadcast"))
    assert versions == ["1", "1"]
    assert second["weights_checked"] == 21 and second["max_abs_diff"] == 0.0 and second["bytes"] > 0
    assert transport.group_name.startswith("prl-wt-broadcast-")
