"""rollout.generate_fn through the rollout manager, with the built-in two-turn calculator
against a real engine server: trajectories, loss masks, rewards and the parquet record."""

from __future__ import annotations

import pytest

from infra.config import RunConfig, TinyModelConfig
from infra.model.tiny import build_tiny_model
from infra.rollout.custom import GroupRequest, Trajectory
from infra.rollout.manager import RolloutManager
from infra.rollout.rollout_files import read_rollout
from infra.rollout.tool_calculator import calculate, calculator_reward
from infra.storage.fs import RunStore
from tests.engine_server import running_engine

CALCULATOR = "infra.rollout.tool_calculator:two_turn_calculator"


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    model = build_tiny_model(tmp_path_factory.mktemp("model"), TinyModelConfig())
    with running_engine(model) as url:
        yield str(model), url


def _manager(engine, tmp_path, generate_fn: str) -> RolloutManager:
    model, url = engine
    cfg = RunConfig.model_validate(
        {
            "rollout": {"prompts_per_rollout": 6, "n_samples_per_prompt": 8, "generate_fn": generate_fn},
            "data": {"train_path": "builtin:digit-add", "eval_path": "builtin:digit-add",
                     "reward": "infra.rollout.tool_calculator:calculator_reward"},
            "storage": {"uri": str(tmp_path)},
            "cluster": {"engines": {"num_workers": 1}},
        }
    )  # fmt: skip
    return RolloutManager(cfg, [url], model)


def test_two_turn_calculator_trajectories(engine, tmp_path) -> None:
    m = _manager(engine, tmp_path, CALCULATOR)
    m.generate(0)
    samples = m.get_batch(0).samples
    assert len(samples) == 6 * 8
    tok = m.tokenizer
    for s in samples:
        first, rest = s.response_ids[:1], s.response_ids[1:]
        env_len = len(s.response_ids) - 2
        assert s.loss_mask == [1] + [0] * env_len + [1]
        called = tok.decode(first) == "?"
        expected = f"[{calculate(s.prompt) if called else ''}]"
        assert tok.decode(rest[:env_len]) == expected  # the environment's tokens, verbatim
        assert s.engine_logprobs[1 : 1 + env_len] == [0.0] * env_len
        assert s.engine_logprobs[0] < 0 and s.engine_logprobs[-1] < 0  # sampled by the policy
        assert s.reward == calculator_reward(s.prompt, s.response, s.label)
    # seeds differ per sample: a group is not n copies of one trajectory
    assert len({tuple(s.response_ids) for s in samples[:8]}) > 1
    stored = read_rollout(RunStore(m.cfg.storage, m.cfg.run_name), 0)
    assert [list(x) for x in stored["loss_mask"]] == [s.loss_mask for s in samples]


def bad_lengths(req: GroupRequest) -> list[Trajectory]:
    return [
        Trajectory(response_ids=[5, 6], loss_mask=[1], engine_logprobs=[0.0, 0.0], weight_version=0)
    ] * req.n


def test_a_malformed_trajectory_is_refused_clearly(engine, tmp_path) -> None:
    m = _manager(engine, tmp_path, f"{__name__}:bad_lengths")
    with pytest.raises(
        ValueError, match="rollout.generate_fn: a trajectory has 2 response tokens but 1 loss_mask"
    ):
        m.generate(0)


def test_calculator_reward() -> None:
    assert calculator_reward("3+4=", "?[7]7", "7") == 1.0
    assert calculator_reward("3+4=", "?[7]5", "7") == 0.5
    assert calculator_reward("3+4=", "x[]7", "7") == 0.5
    assert calculator_reward("3+4=", "x[]5", "7") == 0.0
    assert calculate("12*3=") == "36" and calculate("no expression") == ""
