"""A sample's status follows the engine's finish: a length finish is `truncated`, a stop
token's is `completed`, through a real built-in engine server and the rollout manager."""

from __future__ import annotations

import pandas as pd
import pytest

from infra.config import RunConfig, TinyModelConfig
from infra.engines.launch import launch_engine, stop_engine, wait_until_healthy
from infra.model.tiny import CHARACTERS, EOS, build_tiny_model
from infra.rollout.manager import RolloutManager
from infra.storage.fs import RunStore
from tests.ports import free_port

MAX_NEW = 3


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    model = build_tiny_model(tmp_path_factory.mktemp("model"), TinyModelConfig())
    port = free_port()
    proc = launch_engine("torch", str(model), "127.0.0.1", port, seed=0, threads=1)
    try:
        url = f"http://127.0.0.1:{port}"
        wait_until_healthy(url, proc, 180)
        yield str(model), url
    finally:
        stop_engine(proc)


def generate(engine, tmp_path, stop: list[str]):
    model, url = engine
    cfg = RunConfig.model_validate(
        {
            "rollout": {
                "prompts_per_rollout": 6,
                "n_samples_per_prompt": 4,
                "sampling": {"max_new_tokens": MAX_NEW, "stop": stop},
            },
            "storage": {"uri": str(tmp_path)},
            "data": {"reward": "exact_match"},  # never fails: a failed reward would override the status
            "cluster": {"engines": {"num_workers": 1}},
        }
    )
    m = RolloutManager(cfg, [url], model)
    summary = m.generate(0)
    frame = pd.read_parquet(RunStore(cfg.storage, cfg.run_name).uri("rollouts", "0000000.parquet"))
    return m, m.get_batch(0).samples, summary, frame


def test_length_finish_is_truncated(engine, tmp_path):
    m, samples, summary, frame = generate(engine, tmp_path, stop=[])
    eos = m.tokenizer.convert_tokens_to_ids(EOS)
    # no stop strings: only the end-of-sequence token (about 1% per draw here) ends a response early
    cut = [s for s in samples if len(s.response_ids) == MAX_NEW and s.response_ids[-1] != eos]
    assert len(cut) >= len(samples) - 3
    for s in samples:
        if s in cut:
            assert (s.status, s.finish_reason) == ("truncated", "length")
        else:
            assert (s.status, s.finish_reason) == ("completed", "stop")
            assert s.response_ids[-1] == eos
    assert summary["truncated_frac"] == len(cut) / len(samples)
    assert list(frame["status"]) == [s.status for s in samples]
    assert list(frame["finish_reason"]) == [s.finish_reason for s in samples]


def test_stop_token_finish_is_completed(engine, tmp_path):
    # every printable character stops: the first drawn one ends its response
    m, samples, summary, frame = generate(engine, tmp_path, stop=CHARACTERS)
    stops = set(m.stop_ids) | {m.tokenizer.convert_tokens_to_ids(EOS)}
    for s in samples:
        assert (s.status, s.finish_reason) == ("completed", "stop")
        assert s.response_ids[-1] in stops and len(s.response_ids) <= MAX_NEW
    assert summary["truncated_frac"] == 0.0
    assert set(frame["status"]) == {"completed"} and set(frame["finish_reason"]) == {"stop"}
