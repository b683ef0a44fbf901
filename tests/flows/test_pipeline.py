"""The pipeline end to end on a tiny config: SFT writes its model to the run folder, RL starts
from it, both are evaluated, every stage is a subflow run of its own; a re-run skips the
finished SFT stage and finds RL finished (`resume=auto`)."""

from __future__ import annotations

import asyncio
import json

import pytest
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterParentFlowRunId

from flows.pipeline import pipeline
from infra.config import RunConfig
from infra.sft_stage import export_uri, rl_config
from infra.storage.checkpoints import CheckpointStore, config_hash
from infra.storage.fs import RunStore
from tests.flows.test_rerun import engines_of

pytestmark = pytest.mark.flow


def _config(tmp_path) -> RunConfig:
    return RunConfig.model_validate(
        {
            "run_name": "pipe",
            "num_rollout": 2,
            # a generous start-up: engines start slowly on a loaded machine
            "rollout": {"prompts_per_rollout": 8, "n_samples_per_prompt": 4, "startup_timeout_s": 600},
            "storage": {"uri": str(tmp_path / "runs")},
            "checkpoint": {"resume": "auto", "save_interval": 1, "keep_last": 1},
            "eval": {"interval": None, "num_prompts": 4, "n_samples": 2, "pass_k": [1]},
            # digit-copy's 40 labelled rows: 2 steps an epoch
            "sft": {"epochs": 2, "batch_size": 16, "micro_batch_size": 4},
        }
    )


async def _stage_runs(parent_id) -> list[str]:
    async with get_client() as client:
        runs = await client.read_flow_runs(
            flow_run_filter=FlowRunFilter(parent_flow_run_id=FlowRunFilterParentFlowRunId(any_=[parent_id]))
        )
    return sorted(r.name for r in runs)


@pytest.mark.timeout(1800)  # two pipeline runs, each starting several stages on a loaded 2-core machine
def test_pipeline_runs_sft_rl_eval_and_a_rerun_skips_finished_stages(prefect_api, tmp_path):
    cfg = _config(tmp_path)
    store = RunStore(cfg.storage, cfg.run_name)
    first = pipeline(cfg, return_state=True)
    assert first.is_completed(), first.message
    result = first.result()
    assert result["sft"]["skipped"] is False
    assert result["sft"]["metrics"]["num_steps"] == 2 and result["sft"]["hf_export_uri"] == export_uri(cfg)
    assert store.exists("sft/hf/config.json") and store.exists("sft/hf/model.safetensors")
    for key in ("eval_after_sft", "eval_after_rl"):
        assert 0.0 <= result[key] <= 1.0
    # RL ran with model.path at the SFT stage's model: its checkpoint names that config
    ckpts = CheckpointStore(store, keep_last=None)
    meta = ckpts.meta(ckpts.latest())
    assert meta["next_rollout_id"] == 2
    assert meta["config_hash"] == config_hash(rl_config(cfg, export_uri(cfg))) != config_hash(cfg)
    stages = asyncio.run(_stage_runs(first.state_details.flow_run_id))
    assert stages == ["pipe-eval-rl", "pipe-eval-sft", "pipe-rl", "pipe-sft"]
    done_record = store.read_text("sft/DONE.json")

    again = pipeline(cfg, return_state=True)
    assert again.is_completed(), again.message
    rerun = again.result()
    assert rerun["sft"]["skipped"] is True and store.read_text("sft/DONE.json") == done_record
    assert "already finished" in rerun["rl"]["finished"]
    assert rerun["eval_after_rl"] == result["eval_after_rl"]  # the same model, the same seeds
    assert json.loads(done_record)["metrics"] == rerun["sft"]["metrics"]
    assert engines_of(tmp_path) == []
