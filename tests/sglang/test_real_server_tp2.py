"""A tensor-parallel SGLang engine (tp_size 2) on SGLang's CPU path: its two ranks join the
weight-update group at rank_offset + tp_rank, take a broadcast sync and hold the weights."""

from __future__ import annotations

import pytest
import torch

from tests.sglang.servers import (
    assert_no_kernel_calls,
    broadcast_sync,
    long_context_model,
    perturbed_params,
    real_sglang_server,
)

pytestmark = [pytest.mark.sglang, pytest.mark.sglang_server]


def test_a_tp2_engine_takes_a_sync_on_both_ranks_and_generates(sglang_python: str, tmp_path):
    torch.set_num_threads(1)
    model_dir = long_context_model(tmp_path / "model")
    with real_sglang_server(sglang_python, model_dir, tmp_path, "tp2-key", tp_size=2) as server:
        client = server.client()
        assert client.server_info()["tp_size"] == 2
        params = perturbed_params(model_dir, seed=3)
        report = broadcast_sync(server.url, model_dir, params, "5", timeout_s=60, tp_size=2)
        assert report["weights_checked"] == len(params) and report["max_abs_diff"] == 0.0
        # greedy decoding with the synced weights, as transformers computes it
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        model.load_state_dict(params, strict=False)
        prompt = [1, 20, 21, 22]
        out = client.generate([prompt], {"max_new_tokens": 6, "temperature": 0.0})[0]
        assert out["meta_info"]["weight_version"] == "5"
        expected = model.generate(torch.tensor([prompt]), max_new_tokens=6, do_sample=False)[0, 4:].tolist()
        assert out["output_ids"] == expected
    assert_no_kernel_calls()
