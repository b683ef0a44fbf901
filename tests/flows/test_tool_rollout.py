"""A whole run with the two-turn calculator rollout function learns to use the tool.

At the start the policy calls the calculator in ~1% of samples (a random token out of
~100); GRPO on the shaped reward must make calling the rule. Measured with the same
settings in a 40-iteration run: call rate 0.011 -> 0.42 (iteration 10) -> 0.99 (20), and
correct final answers 0.006 -> 0.13-0.20.
"""

import pandas as pd
import pytest

from flows.train import train
from infra.config import RunConfig
from infra.storage.fs import RunStore
from infra.storage.metrics import read_metrics

pytestmark = pytest.mark.flow


def test_tool_use_rollouts_learn_to_call_the_calculator(prefect_api, tmp_path):
    cfg = RunConfig.model_validate(
        {
            "run_name": "calculator",
            "num_rollout": 20,
            "rollout": {"generate_fn": "infra.rollout.tool_calculator:two_turn_calculator"},
            "data": {
                "train_path": "builtin:digit-add",
                "eval_path": "builtin:digit-add",
                "reward": "infra.rollout.tool_calculator:calculator_reward",
            },
            "storage": {"uri": str(tmp_path / "runs")},
            "eval": {"interval": None},
            "checkpoint": {"save_interval": None},
        }
    )
    state = train(cfg, return_state=True)
    assert state.is_completed(), state.message
    store = RunStore(cfg.storage, cfg.run_name)
    rows = read_metrics(store)
    assert [r["rollout_id"] for r in rows] == list(range(20))

    def call_rate(k: int) -> float:
        df = pd.read_parquet(store.uri(f"rollouts/{k:07d}.parquet"))
        assert all(list(m)[1:-1] == [0] * (len(m) - 2) for m in df["loss_mask"])  # tool tokens masked
        return float(df["response"].str.startswith("?[").mean())

    assert call_rate(0) < 0.1
    assert call_rate(19) > 0.5
    assert rows[-1]["reward_mean"] > rows[0]["reward_mean"] + 0.2
