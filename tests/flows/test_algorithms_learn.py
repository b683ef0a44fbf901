"""Short learning runs of the whole flow per advantage estimator (the demo task, 10 iterations).

With the demo's defaults the reward of `digit-copy` starts near 0.01 (no constant answer
scores above 0.1); every estimator must lift it tenfold within 10 iterations.
"""

import pytest

from flows.train import train
from infra.config import RunConfig
from infra.storage.fs import RunStore
from infra.storage.metrics import read_metrics

pytestmark = pytest.mark.flow


@pytest.mark.parametrize("estimator", ["grpo", "reinforce_plus_plus"])
def test_estimator_learns_the_demo_task(prefect_api, tmp_path, estimator):
    cfg = RunConfig.model_validate(
        {
            "run_name": f"learn-{estimator}",
            "num_rollout": 10,
            "algorithm": {"advantage_estimator": estimator},
            "storage": {"uri": str(tmp_path / "runs")},
            "checkpoint": {"save_interval": None},
            "eval": {"interval": None},
        }
    )
    state = train(cfg, return_state=True)
    assert state.is_completed(), state.message
    rows = read_metrics(RunStore(cfg.storage, cfg.run_name))
    rewards = [r["reward_mean"] for r in rows]
    print(estimator, [round(r, 3) for r in rewards])
    # measured (digit-copy with end marks): grpo 0.008 -> 0.149 (last-3 mean 0.111),
    # reinforce_plus_plus 0.008 -> 0.139 (last-3 mean 0.112) at iteration 9
    assert rewards[0] < 0.02
    assert sum(rewards[-3:]) / 3 > 0.09 and rewards[-1] > 10 * rewards[0], rewards
    last = rows[-1]
    # async mode: TIS is on and the batch is one version stale; the metrics say so
    assert last["staleness_mean"] == 1 and 0 < last["tis_weight_mean"] <= 2.0
    assert last["skipped_steps"] == 0 and last["entropy"] > 0
    assert 0 <= last["zero_variance_group_frac"] <= 1
