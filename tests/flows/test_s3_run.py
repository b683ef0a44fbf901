"""A whole run on S3 (a moto server on loopback): model, rollouts, metrics, checkpoints and
the HF export live in the bucket, and the credentials appear in none of what is stored."""

import asyncio
import json

import pandas as pd
import pytest
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId

from flows.train import train
from infra.config import RunConfig
from infra.storage.fs import RunStore
from infra.storage.metrics import read_metrics

pytestmark = [pytest.mark.flow, pytest.mark.s3]
SECRET = "s3cr3t-value-that-must-not-leak"


async def _flow_run_text(flow_run_id) -> str:
    async with get_client() as client:
        run = await client.read_flow_run(flow_run_id)
        logs = await client.read_logs(
            log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=[flow_run_id]))
        )
    return json.dumps(run.parameters) + "\n".join(log.message for log in logs)


def test_run_on_s3(prefect_api, s3_bucket, monkeypatch):
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)  # moto accepts any secret
    cfg = RunConfig.model_validate(
        {
            "run_name": "s3run",
            "num_rollout": 2,
            "rollout": {"prompts_per_rollout": 8, "n_samples_per_prompt": 4},
            "storage": {"uri": f"{s3_bucket}/runs"},
            "checkpoint": {"save_interval": 1, "keep_last": 1},
            "eval": {"interval": None},
        }
    )
    state = train(cfg, return_state=True)
    assert state.is_completed(), state.message
    store = RunStore(cfg.storage, cfg.run_name)

    # a user reads the outputs straight from the bucket (credentials from the environment)
    frame = pd.read_parquet(f"{s3_bucket}/runs/s3run/rollouts/0000001.parquet")
    assert len(frame) == 32 and frame["weight_version"].notna().all()
    assert [r["rollout_id"] for r in read_metrics(store)] == [0, 1]
    assert store.exists("base_model/config.json")
    assert store.exists("checkpoints/iter_0000001/COMMITTED")
    assert not store.exists("checkpoints/iter_0000000")  # keep_last=1
    assert store.exists("hf/latest/model.safetensors")

    stored = store.read_text("metrics.jsonl") + store.read_text("checkpoints/iter_0000001/meta.json")
    assert SECRET not in stored
    assert SECRET not in asyncio.run(_flow_run_text(state.state_details.flow_run_id))
