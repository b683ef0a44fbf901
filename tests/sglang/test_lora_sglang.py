"""LoRA post-training with SGLang's real server (CPU) as the engine, in sync mode: every
sample comes from the weights the trainer holds when it trains on it, so SGLang's logprobs
and the trainer's must agree (within 1e-4) however the adapter reached the server.

`merged` sends full weights with the adapter merged in: stock SGLang, no stand-in.
`adapter` has SGLang load each version with `/load_lora_adapter` and name it per request;
on CPU it runs SGLang's `torch_native` LoRA backend, with the stand-in that makes pinned
memory plain memory (tests/sglang/standins). SGLang's GPU LoRA backends (csgmv, its
default, and triton) need GPU kernels and are not exercised here.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from flows.train import train
from infra.config_files import load_config
from infra.storage.fs import RunStore
from infra.storage.metrics import read_metrics
from tests.flows import conftest as flow_fixtures
from tests.sglang.servers import assert_no_kernel_calls

pytestmark = [pytest.mark.sglang, pytest.mark.sglang_server, pytest.mark.flow]
prefect_api = flow_fixtures.prefect_api  # the flow tier's API server fixture

REPO = Path(__file__).resolve().parents[2]


def _run(tmp_path: Path, sglang_python: str, name: str, *overrides: str) -> tuple[RunStore, list[dict]]:
    cfg = load_config(
        REPO / "configs" / "sglang-cpu.yaml",
        [
            f"run_name={name}",
            "mode=sync",
            "num_rollout=3",
            f"storage.uri={tmp_path / 'runs'}",
            f"rollout.sglang_python={sglang_python}",
            "rollout.prompts_per_rollout=8",
            "rollout.n_samples_per_prompt=4",
            "cluster.trainer.num_workers=1",
            "checkpoint.save_interval=null",
            "eval.interval=null",
            "model.lora.r=4",
            "model.lora.target_modules=[q_proj,k_proj,v_proj,o_proj]",
            "algorithm.lr=0.05",  # large steps: the adapter's effect is far above the tolerance
            *overrides,
        ],
    )
    state = train(cfg, return_state=True)
    assert state.is_completed(), state.message
    assert_no_kernel_calls()
    store = RunStore(cfg.storage, name)
    return store, read_metrics(store)


def _assert_sglang_matches_trainer(rows: list[dict]) -> None:
    assert [r["rollout_id"] for r in rows] == [0, 1, 2]
    print("engine/trainer max logprob gap:", [r["train_engine_logprob_abs_diff_max"] for r in rows])
    for r in rows:
        assert r["train_engine_logprob_tokens"] > 0 and r["train_engine_logprob_tokens_stale"] == 0
        assert r["train_engine_logprob_abs_diff_max"] < 1e-4, r
    assert rows[-1]["entropy"] != rows[0]["entropy"]  # the adapter moved the policy


def test_merged_adapter_on_stock_sglang(prefect_api, sglang_python, tmp_path):  # noqa: F811
    _, rows = _run(tmp_path, sglang_python, "lora-merged", "weight_sync.lora=merged")
    _assert_sglang_matches_trainer(rows)
    for r in rows:  # configs/sglang-cpu.yaml checks every tensor after every sync
        assert r["weights_checked"] > 0 and r["max_abs_diff"] == 0.0, r


def test_adapter_loaded_by_sglang(prefect_api, sglang_python, tmp_path):  # noqa: F811
    store, rows = _run(
        tmp_path,
        sglang_python,
        "lora-adapter",
        "weight_sync.lora=adapter",
        "weight_sync.check_weight_update_equal=false",
    )
    _assert_sglang_matches_trainer(rows)
    assert [e.rsplit("/", 1)[-1] for e in store.ls("adapters")] == ["v0000003"]
    for k in range(3):
        versions = set(pd.read_parquet(store.uri("rollouts", f"{k:07d}.parquet"))["weight_version"])
        assert versions == {k}
