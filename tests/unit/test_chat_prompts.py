"""Chat-format data through the rollout manager: messages rows, the model's own chat
template, a system prompt and the prompt length limit, against a real engine server."""

from __future__ import annotations

import json

import pytest
from transformers import AutoTokenizer

from infra.config import RunConfig, TinyModelConfig
from infra.model.tiny import build_tiny_model
from infra.rollout.manager import RolloutManager
from tests.engine_server import running_engine

TEMPLATE = (
    "{% for m in messages %}[{{ m['role'] }}]{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}[assistant]{% endif %}"
)


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    model = build_tiny_model(tmp_path_factory.mktemp("model"), TinyModelConfig(max_position_embeddings=96))
    tok = AutoTokenizer.from_pretrained(model)
    tok.chat_template = TEMPLATE  # saved with the model, as an instruct model ships it
    tok.save_pretrained(model)
    with running_engine(model) as url:
        yield str(model), url


def _data(tmp_path) -> str:
    rows = [{"prompt": [{"role": "user", "content": f"{d}:"}], "label": str(d)} for d in range(3)] + [
        {"prompt": [{"role": "user", "content": "x" * 40}], "label": "0"}
    ]
    path = tmp_path / "chat.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def test_messages_get_the_template_system_prompt_and_length_limit(engine, tmp_path) -> None:
    model, url = engine
    data = _data(tmp_path)
    cfg = RunConfig.model_validate(
        {
            "rollout": {
                "prompts_per_rollout": 4,
                "n_samples_per_prompt": 2,
                "sampling": {"max_new_tokens": 2},
            },
            "storage": {"uri": str(tmp_path / "runs")},
            "data": {
                "train_path": data,
                "eval_path": data,
                "system_prompt": "S",
                "max_prompt_len": 30,  # the 40-character prompt is over it once templated
            },
            "cluster": {"engines": {"num_workers": 1}},
        }
    )
    m = RolloutManager(cfg, [url], model)
    summary = m.generate(0)
    samples = m.get_batch(0).samples
    assert summary["prompts_dropped"] == 1
    assert len(samples) == 3 * 2
    texts = sorted({s.prompt for s in samples})
    assert texts == [f"[system]S\n[user]{d}:\n[assistant]" for d in range(3)]
    tok = AutoTokenizer.from_pretrained(model)
    for s in samples:  # the engine got exactly the templated ids
        assert tok.decode(s.prompt_ids) == s.prompt


def test_truncate_left_keeps_the_end_of_long_prompts(engine, tmp_path) -> None:
    model, url = engine
    data = _data(tmp_path)
    cfg = RunConfig.model_validate(
        {
            "rollout": {
                "prompts_per_rollout": 4,
                "n_samples_per_prompt": 2,
                "sampling": {"max_new_tokens": 1},
                # one round: the batch holds every prompt once (extra rounds may keep two
                # groups of one prompt and none of another)
                "dynamic_sampling": False,
            },
            "storage": {"uri": str(tmp_path / "runs")},
            "data": {
                "train_path": data,
                "eval_path": data,
                "max_prompt_len": 30,
                "overlong_prompt": "truncate_left",
            },
            "cluster": {"engines": {"num_workers": 1}},
        }
    )
    m = RolloutManager(cfg, [url], model)
    assert m.generate(0)["prompts_dropped"] == 0
    lengths = sorted(len(s.prompt_ids) for s in m.get_batch(0).samples)
    assert lengths[-1] == 30 and lengths[0] < 30


def test_several_eval_sets_each_with_its_settings(engine, tmp_path) -> None:
    model, url = engine
    data = _data(tmp_path)
    cfg = RunConfig.model_validate(
        {
            "rollout": {
                "prompts_per_rollout": 4,
                "n_samples_per_prompt": 2,
                "sampling": {"max_new_tokens": 1},
            },
            "storage": {"uri": str(tmp_path / "runs")},
            "data": {"train_path": data, "eval_path": data},
            "cluster": {"engines": {"num_workers": 1}},
            "eval": {
                "pass_k": [1],
                "datasets": [
                    {"name": "copy", "path": "builtin:digit-copy", "n_samples": 3, "num_prompts": 4},
                    {"name": "chat", "path": data, "n_samples": 1, "max_new_tokens": 4, "reward": "contains"},
                ],
            },
        }
    )
    m = RolloutManager(cfg, [url], model)
    result = m.evaluate(0)
    assert result["eval_copy_num_samples"] == 4 * 3
    assert result["eval_chat_num_samples"] == 4 * 1
    # the first set is also the headline eval metric the artifacts plot
    assert result["eval_reward_mean"] == result["eval_copy_reward_mean"]
    assert {"eval_copy_pass@1", "eval_chat_pass@1", "time_eval_s", "examples"} <= set(result)
    with pytest.raises(ValueError, match="eval.pass_k.*eval.datasets\\[copy\\].n_samples=1"):
        RunConfig.model_validate(
            {
                "eval": {
                    "pass_k": [2],
                    "datasets": [{"name": "copy", "path": "builtin:digit-copy", "n_samples": 1}],
                }
            }
        )
