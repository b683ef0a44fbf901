"""The simulated engines of bench/sim_engine.py answer the project's own EngineClient and the
rollout manager (without Ray) as a real engine does: shapes, lengths, versions, aborts."""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor

import pandas as pd
import pytest

from bench.sim_engine import SimSpec, serve
from infra.config import RunConfig, TinyModelConfig
from infra.engines.client import EngineClient
from infra.model.tiny import build_tiny_model
from infra.rollout.manager import RolloutManager
from tests.background_loop import background_loop

SPEC = SimSpec(median_tokens=8, slots=4, slot_tokens_per_s=2000)


@pytest.fixture(scope="module")
def loop():
    with background_loop() as running:
        yield running


@pytest.fixture(scope="module")
def urls(loop):
    return asyncio.run_coroutine_threadsafe(serve(SPEC, 2), loop).result(timeout=30)


def test_generate_answers_as_sglang_does(urls):
    client = EngineClient(urls[0])
    assert client.health()
    params = [{"max_new_tokens": 4096, "sampling_seed": s, "stop_token_ids": [2]} for s in (11, 12)]
    params.append({"max_new_tokens": 3, "sampling_seed": 13})
    outs = client.generate([[5, 6], [5, 6], [7]], params, rid=["a", "b", "c"])
    assert [o["meta_info"]["id"] for o in outs] == ["a", "b", "c"]
    for out, sp in zip(outs, params, strict=True):
        meta, ids = out["meta_info"], out["output_ids"]
        assert (
            len(ids)
            == meta["completion_tokens"]
            == min(SPEC.length(sp["sampling_seed"]), sp["max_new_tokens"])
        )
        assert [t for _, t, _ in meta["output_token_logprobs"]] == ids
        assert all(lp <= 0 for lp, _, _ in meta["output_token_logprobs"])
        assert meta["weight_version"] == "0"
    assert (
        outs[0]["meta_info"]["finish_reason"] == {"type": "stop", "matched": 2}
        and outs[0]["output_ids"][-1] == 2
    )
    assert outs[2]["meta_info"]["finish_reason"]["type"] == "length"


def test_weight_update_and_abort(loop):
    slow = SimSpec(median_tokens=100, sigma=0.01, slot_tokens_per_s=10)  # ~10 s a sample
    [url] = asyncio.run_coroutine_threadsafe(serve(slow, 1), loop).result(timeout=30)
    client = EngineClient(url)
    client.pause_generation("retract")
    client.begin_weight_update()
    client.update_weights_from_distributed(["w"], ["float32"], [[1]], "g", weight_version="7")
    client.end_weight_update()
    client.continue_generation()
    assert client.weight_version() == "7"
    slow = SPEC.tail_factor * 1000  # long enough to be aborted while it decodes
    with ThreadPoolExecutor(1) as pool:
        running = pool.submit(
            client.generate, [[5]], [{"max_new_tokens": int(slow), "sampling_seed": 1}], ["x"]
        )
        time.sleep(0.2)
        client.abort_request("x")
        [out] = running.result(timeout=10)
    meta = out["meta_info"]
    assert meta["finish_reason"]["type"] == "abort" and meta["weight_version"] == "7"
    assert 1 <= meta["completion_tokens"] < 50  # the tokens it had made, not the whole sample


def test_the_rollout_manager_generates_on_them(urls, tmp_path):
    model = build_tiny_model(tmp_path / "model", TinyModelConfig())
    rollout = {"prompts_per_rollout": 6, "n_samples_per_prompt": 4, "sampling": {"max_new_tokens": 64}}
    # one round: what dynamic sampling draws again depends on the rewards of the engines' tokens
    rollout["dynamic_sampling"] = False
    cfg = RunConfig.model_validate({"rollout": rollout, "storage": {"uri": str(tmp_path)}})
    manager = RolloutManager(cfg, urls, str(model))
    summary = manager.generate(0)
    batch = manager.get_batch(0)
    assert len(batch.samples) == 24 and summary["num_samples"] == 24
    seed = cfg.rollout.seed * 2**40
    assert [len(s.response_ids) for s in batch.samples] == [min(SPEC.length(seed + j), 64) for j in range(24)]
    assert all(len(s.engine_logprobs) == len(s.response_ids) for s in batch.samples)
    assert pd.read_parquet(summary["rollout_uri"]).shape[0] == 24
