"""One short async run with a TensorBoard tracker, dynamic sampling and RLOO advantages:
the event file holds every row's reward, dynamic sampling drops and refills flat groups,
and the losses stay finite."""

import json
import math

import pandas as pd
import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from flows.train import train
from infra.config_files import load_config
from infra.storage.fs import RunStore
from infra.storage.metrics import read_metrics

pytestmark = pytest.mark.flow
PROMPTS, COPIES = 8, 4


def leading_digit(prompt: str, response: str, label: str, **kw) -> float:
    # about 1 draw in 10 of the untrained model: some groups vary, many are flat
    return float(response[:1].isdigit())


def test_tensorboard_dynamic_sampling_and_rloo(prefect_api, tmp_path):
    data = tmp_path / "prompts.jsonl"
    data.write_text(
        "".join(json.dumps({"q": f"{i % 10}{i // 10}:", "a": str(i % 10)}) + "\n" for i in range(64))
    )
    cfg = load_config(
        None,
        [
            "run_name=tracked",
            "num_rollout=3",
            f"storage.uri={tmp_path / 'runs'}",
            f"data.train_path={data}",
            "data.prompt_key=q",
            "data.label_key=a",
            f"data.reward={__name__}:leading_digit",
            f"rollout.prompts_per_rollout={PROMPTS}",
            f"rollout.n_samples_per_prompt={COPIES}",
            "rollout.sampling.max_new_tokens=2",
            "rollout.sampling.stop=[]",
            "rollout.dynamic_sampling=true",
            "rollout.dynamic_sampling_max_rounds=2",
            "rollout.dynamic_sampling_resample=stuck",
            "algorithm.advantage_estimator=rloo",
            "tracking.backends=[tensorboard]",
            "checkpoint.save_interval=null",
            "eval.interval=null",
        ],
    )
    state = train(cfg, return_state=True)
    assert state.is_completed(), state.message
    store = RunStore(cfg.storage, cfg.run_name)
    rows = read_metrics(store)
    assert [r["rollout_id"] for r in rows] == [0, 1, 2]

    for r in rows:
        assert math.isfinite(r["loss"]) and math.isfinite(r["grad_norm"]) and r["skipped_steps"] == 0
        # the batch keeps its size; the flat groups in it are the ones that filled it
        assert r["num_samples"] == PROMPTS * COPIES
        assert 1 <= r["dynamic_sampling_rounds"] <= 3
        assert r["dynamic_sampling_filled_groups"] == round(r["zero_variance_group_frac"] * PROMPTS)
        assert 0 <= r["dynamic_sampling_batch_reward_mean"] <= 1
    # an extra round draws only the prompts still stuck (resample=stuck): fewer
    # than a whole round each time, as prompts with signal or solved are not drawn again
    searched = [r for r in rows if r["dynamic_sampling_rounds"] > 1]
    assert searched
    for r in searched:
        assert r["dynamic_sampling_samples"] < r["dynamic_sampling_rounds"] * PROMPTS * COPIES
    # at this reward rate a round of 8 groups holds flat ones: some were dropped
    assert sum(r["dynamic_sampling_dropped_groups"] for r in rows) > 0

    for k in range(3):
        frame = pd.read_parquet(store.uri("rollouts", f"{k:07d}.parquet"))
        assert sorted(set(frame["group"])) == list(range(PROMPTS))
        for _, g in frame.groupby("group"):
            # RLOO: each sample's reward minus the mean of the other copies' rewards
            rewards = list(g["reward"])
            expected = [r - (sum(rewards) - r) / (COPIES - 1) for r in rewards]
            assert list(g["advantage"]) == pytest.approx(expected, abs=1e-6)

    events = EventAccumulator(store.path("tensorboard"))
    events.Reload()
    assert "reward_mean" in events.Tags()["scalars"]
    logged = events.Scalars("reward_mean")
    assert [e.step for e in logged] == [0, 1, 2]
    assert [e.value for e in logged] == pytest.approx([r["reward_mean"] for r in rows], abs=1e-6)
