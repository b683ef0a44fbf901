"""The PPO critic's FSDP2 group on 2 gloo ranks (spawned processes) with the tiny model:
its value loss falls on a fixed rollout, and its DCP checkpoint round-trips exactly."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch

from infra.config import RunConfig
from infra.rollout.batch import RolloutBatch, Sample
from tests.dist.rank_state import full_train_state
from tests.dist.ranks import spawn_ranks
from tests.ports import free_port

pytestmark = pytest.mark.dist
ADDR = "127.0.0.1"


def _cfg() -> RunConfig:
    return RunConfig.model_validate(
        {
            "rollout": {
                "prompts_per_rollout": 2,
                "n_samples_per_prompt": 4,
                "sampling": {"max_new_tokens": 6},
            },
            "algorithm": {"advantage_estimator": "ppo", "micro_batch_size": 2, "lam": 0.95},
            "critic": {"enabled": True, "lr": 1e-2},
        }
    )


def _batch() -> RolloutBatch:
    g = random.Random(3)
    samples = []
    for i in range(8):
        response = [] if i == 5 else [g.randrange(4, 100) for _ in range(g.randint(1, 6))]
        samples.append(
            Sample(
                prompt="", label="", response="",
                prompt_ids=[g.randrange(4, 100) for _ in range(g.randint(3, 8))],
                response_ids=response, engine_logprobs=[-4.0] * len(response),
                weight_version=0, group=i // 4, reward=float(i % 3 == 0),
            )
        )  # fmt: skip
    return RolloutBatch(rollout_id=0, samples=samples)


def _worker(rank: int, port: int, model_dir: str, out: str) -> None:
    from infra.trainer.critic_rank import CriticRank

    torch.set_num_threads(1)
    critic = CriticRank(_cfg(), rank, 2)
    critic.setup(model_dir, {}, ADDR, port)
    batch, metrics, values = _batch(), [], []
    for k in range(6):
        values.append(critic.compute_values(k, batch))
        metrics.append(critic.train(k, batch))
    critic.save_checkpoint(f"{out}/critic", {})
    saved = full_train_state(critic)
    critic.compute_values(6, batch)
    after_save = critic.train(6, batch)
    critic.load_checkpoint(f"{out}/critic", {})
    loaded = full_train_state(critic)
    critic.compute_values(6, batch)
    after_load = critic.train(6, batch)
    result = {"metrics": metrics, "values": values, "after_save": after_save, "after_load": after_load}
    if rank == 0:  # full state dicts are gathered by all ranks but held by rank 0 only
        result.update(saved=saved, loaded=loaded)
    torch.save(result, f"{out}/r{rank}.pt")
    critic.shutdown()


@pytest.fixture(scope="module")
def ran(model_dir, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("critic")
    spawn_ranks(_worker, free_port(), str(model_dir), str(out))
    return out


def _assert_equal_tree(a, b, path="") -> None:
    if isinstance(a, dict):
        assert a.keys() == b.keys(), path
        for k in a:
            _assert_equal_tree(a[k], b[k], f"{path}/{k}")
    elif isinstance(a, torch.Tensor):
        assert torch.equal(a, b), path
    else:
        assert a == b, path


def test_critic_group_fits_the_returns_of_a_fixed_batch(ran):
    r0, r1 = torch.load(ran / "r0.pt"), torch.load(ran / "r1.pt")
    losses = [m["value_loss"] for m in r0["metrics"]]
    print("value loss", [round(x, 4) for x in losses])
    assert losses[-1] < 0.5 * losses[0], losses
    assert r0["metrics"][-1]["value_explained_var"] > r0["metrics"][0]["value_explained_var"]
    # both ranks computed the same numbers; rank 0 hands out the values, one per response token
    drop = ("time_critic_step_s",)
    assert [{k: v for k, v in m.items() if k not in drop} for m in r0["metrics"]] == [
        {k: v for k, v in m.items() if k not in drop} for m in r1["metrics"]
    ]
    lengths = [len(s.response_ids) for s in _batch().samples]
    assert [len(v) for v in r0["values"][0]] == lengths and r1["values"][0] == []
    assert r0["values"][0] != r0["values"][-1]  # the values moved as the critic trained


def test_critic_checkpoint_round_trip_is_exact(ran):
    r0, r1 = torch.load(ran / "r0.pt"), torch.load(ran / "r1.pt")
    assert r0["saved"]["optim"]["state"], "the optimizer state must not be empty"
    _assert_equal_tree(r0["saved"], r0["loaded"])
    # training on from the loaded state repeats the step taken right after the save
    for r in (r0, r1):
        assert r["after_load"]["value_loss"] == r["after_save"]["value_loss"]
        assert r["after_load"]["value_mean"] == r["after_save"]["value_mean"]
