"""PPO with a value critic, end to end: a short learning run on the demo task, stopped half
way (checkpointed) and resumed, with train-critic task runs beside the train task runs."""

import asyncio

import pytest
import torch
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

from flows.train import train
from infra.config import RunConfig
from infra.rollout.batch import Sample
from infra.rollout.rollout_files import read_rollout
from infra.storage.checkpoints import CheckpointStore
from infra.storage.fs import RunStore
from infra.storage.metrics import read_metrics

pytestmark = pytest.mark.flow


async def _task_runs(flow_run_id) -> dict:
    async with get_client() as client:
        runs = await client.read_task_runs(
            flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id]))
        )
    return {r.name: r for r in runs}


def _run(cfg: RunConfig) -> dict:
    state = train(cfg, return_state=True)
    assert state.is_completed(), state.message
    return asyncio.run(_task_runs(state.state_details.flow_run_id))


def _value_mean(store: RunStore, cfg: RunConfig, rollout_id: int, critic_ckpt: str | None) -> float:
    """The mean value a critic gives rollout `rollout_id`: fresh, or loaded from a checkpoint."""
    import torch.distributed.checkpoint as dcp

    from infra.trainer.critic_rank import load_value_model
    from infra.trainer.critic_step import compute_values
    from infra.trainer.ppo_targets import response_mask

    torch.manual_seed(cfg.algorithm.seed)  # the fresh head the critic ranks draw
    model_dir = store.uri("base_model")
    critic = load_value_model(model_dir)
    if critic_ckpt is not None:
        state = {"model": critic.state_dict()}
        dcp.load(state, checkpoint_id=critic_ckpt)  # resharded from the 2 ranks' shards
        critic.load_state_dict(state["model"])
    fields = Sample.__dataclass_fields__
    samples = [
        Sample(**{k: (v.tolist() if hasattr(v, "tolist") else v) for k, v in row.items() if k in fields})
        for row in read_rollout(store, rollout_id).to_dict("records")
    ]
    values = compute_values(critic, samples, cfg, rank=0, world_size=1)
    mask = response_mask(samples)
    return float((values * mask).sum() / mask.sum())


def test_ppo_learns_trains_the_critic_beside_the_actor_and_resumes_it(prefect_api, tmp_path):
    tree = {
        "run_name": "learn-ppo",
        "num_rollout": 10,
        "iterations_per_run": 5,  # the first flow run stops (checkpointed) after 5 iterations
        "num_critic_only_steps": 1,
        "algorithm": {"advantage_estimator": "ppo"},
        "critic": {"enabled": True},
        "storage": {"uri": str(tmp_path / "runs")},
        "checkpoint": {"save_interval": None, "resume": "auto"},
        "eval": {"interval": None},
    }
    cfg = RunConfig.model_validate(tree)
    first = _run(cfg)
    second = _run(cfg)  # resumes at iteration 5: actor AND critic from the checkpoint

    for k in range(10):
        runs = first if k < 5 else second
        assert runs[f"train-critic-{k:04d}"].state.is_completed()
        # iteration 0 is critic-only: no actor train task at all
        assert (f"train-{k:04d}" in runs) == (k >= 1), k
    rows = read_metrics(RunStore(cfg.storage, cfg.run_name))
    assert [r["rollout_id"] for r in rows] == list(range(10))
    rewards = [r["reward_mean"] for r in rows]
    critic = [
        (round(r["value_loss"], 4), round(r["value_explained_var"], 3), round(r["value_mean"], 3))
        for r in rows
    ]
    print("ppo reward", [round(x, 3) for x in rewards])
    print("critic (value loss, explained var, value mean)", critic)
    print("time train / critic / iteration", [
        (round(r["time_train_s"], 2), round(r["time_train_critic_s"], 2), round(r["time_iteration_s"], 2))
        for r in rows
    ])  # fmt: skip

    # iteration 0 trained the critic only: no actor metrics, and the engines kept the weights
    assert "loss" not in rows[0] and rows[0]["time_train_s"] == 0.0 and rows[0]["value_loss"] > 0
    assert rows[1]["num_steps"] == 1 and rows[1]["loss"] != 0
    assert all(r["critic_num_steps"] == 1 and r["critic_skipped_steps"] == 0 for r in rows)
    # the resumed run's critic is the checkpointed one: its first values (of batch 5, before
    # training) are those of the critic saved at iteration 4, not of a fresh critic
    store = RunStore(cfg.storage, cfg.run_name)
    saved = f"{CheckpointStore(store, keep_last=2).uri(4)}/critic"
    restored, fresh = _value_mean(store, cfg, 5, saved), _value_mean(store, cfg, 5, None)
    print(
        "value mean of batch 5: resumed run", rows[5]["value_mean"], "saved critic", restored, "fresh", fresh
    )
    assert rows[5]["value_mean"] == pytest.approx(restored, rel=1e-4, abs=1e-6)
    assert abs(restored - fresh) > 100 * abs(rows[5]["value_mean"] - restored)
    # learns, slower than grpo/reinforce++ in tests/flows/test_algorithms_learn.py: the critic
    # starts from a fresh value head and iteration 0 has no actor step. Measured (2 cores):
    # 0.009 0.010 0.010 0.014 0.020 | 0.038 0.026 0.035 0.039 0.078 (last 3: 0.051)
    assert rewards[0] < 0.02
    assert sum(rewards[-3:]) / 3 > 0.03 and rewards[-1] > 5 * rewards[0], rewards
