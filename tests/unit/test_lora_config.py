"""`model.lora` and `weight_sync.lora`: what a run with an adapter may ask for, refused at
config time with the field named."""

import pytest
from pydantic import ValidationError

from infra.config import RunConfig


def _cfg(**sections) -> RunConfig:
    return RunConfig.model_validate(sections)


def test_lora_defaults_and_full_fine_tuning():
    assert _cfg().model.lora is None and _cfg().weight_sync.lora == "merged"
    lora = _cfg(model={"lora": {"r": 4}}).model.lora
    assert (lora.r, lora.alpha, lora.dropout) == (4, 16, 0.0)
    assert lora.target_modules == ["q_proj", "k_proj", "v_proj", "o_proj"]


@pytest.mark.parametrize(
    "sections,field",
    [
        ({"weight_sync": {"lora": "adapter"}}, "weight_sync.lora=adapter"),
        ({"model": {"lora": {"r": 0}}}, "r"),
        ({"model": {"lora": {"target_modules": []}}}, "target_modules"),
        ({"model": {"lora": {"dropout": 1.0}}}, "dropout"),
        ({"model": {"lora": {"rank": 8}}}, "rank"),
        (
            {
                "model": {"lora": {"target_modules": ["q_proj", "embed_tokens"]}},
                "weight_sync": {"lora": "adapter"},
            },
            "model.lora.target_modules",
        ),
        (
            {
                "model": {"lora": {}},
                "weight_sync": {"lora": "adapter"},
                "rollout": {"generate_fn": "m:f"},
            },
            "rollout.generate_fn",
        ),
    ],
)
def test_refused_with_the_field_named(sections, field):
    with pytest.raises(ValidationError, match=field):
        _cfg(**sections)


def test_what_only_the_builtin_engine_refuses():
    # embed_tokens: merged weights carry it to any engine; SGLang applies it as an adapter too
    _cfg(model={"lora": {"target_modules": ["embed_tokens"]}})
    _cfg(model={"lora": {"target_modules": ["q_proj", "lm_head"]}}, weight_sync={"lora": "adapter"})
    _cfg(
        model={"lora": {"target_modules": ["q_proj", "embed_tokens"]}},
        weight_sync={"lora": "adapter"},
        rollout={"engine": "sglang"},
        cluster={"engines": {"gpus_per_worker": 1}},
    )
