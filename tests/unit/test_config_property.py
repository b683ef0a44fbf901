"""Property-based: malformed configs, through the real CLI entry point, each fail with an
error naming the field, before anything is written or started."""

from __future__ import annotations

import types
import typing
from pathlib import Path

import psutil
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, ValidationError

from flows.train import main
from infra.config import RunConfig

_NOT_A_NUMBER = st.one_of(
    st.text(alphabet="abcxyz", min_size=1), st.lists(st.integers(), min_size=1), st.just({})
)


def _bounds(field) -> dict:
    out = {}
    for m in field.metadata:
        for name in ("ge", "gt", "le", "lt"):
            if getattr(m, name, None) is not None:
                out[name] = getattr(m, name)
    return out


def _invalid(field) -> st.SearchStrategy | None:
    ann = field.annotation
    args = [a for a in typing.get_args(ann) if a is not type(None)]
    base = args[0] if isinstance(ann, types.UnionType) and len(args) == 1 else ann
    b = _bounds(field)
    if typing.get_origin(base) is typing.Literal:
        return st.text(min_size=1).filter(lambda s: s not in typing.get_args(base))
    if base is bool:
        return st.one_of(
            st.text(alphabet="xyz", min_size=2), st.integers(min_value=2), st.lists(st.none(), min_size=1)
        )
    if base in (int, float):
        options = [_NOT_A_NUMBER]
        if "ge" in b:
            options.append(st.integers(max_value=int(b["ge"]) - 1))
        if "gt" in b:
            options.append(st.integers(max_value=int(b["gt"])))
        if "le" in b:
            options.append(st.integers(min_value=int(b["le"]) + 1))
        if base is int:
            options.append(st.floats(min_value=0.1, max_value=0.9))
        return st.one_of(*options)
    if base is str:
        return st.one_of(st.integers(), st.lists(st.text(), min_size=1), st.just({"a": 1}))
    if typing.get_origin(base) is list:
        return st.one_of(st.integers(), st.just({"a": 1}))
    return None


def _leaves(model: type[BaseModel], prefix: str = "") -> list[tuple[str, st.SearchStrategy]]:
    out = []
    for name, field in model.model_fields.items():
        ann = field.annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            out += _leaves(ann, f"{prefix}{name}.")
            out.append((f"{prefix}{name}.no_such_setting", st.integers()))  # a typo
            out.append((f"{prefix}{name}", st.one_of(st.integers(), st.text(alphabet="xyz", min_size=1))))
        else:
            strategy = _invalid(field)
            if strategy is not None:
                out.append((f"{prefix}{name}", strategy))
    return out


LEAVES = dict(_leaves(RunConfig))
# cross-field rules: each names the fields involved
RULES = {
    "algorithm.global_batch_size": ["algorithm.global_batch_size=100"],
    "cluster.trainer.num_workers": ["algorithm.global_batch_size=32", "cluster.trainer.num_workers=3"],
    "eval.pass_k": ["eval.n_samples=2", "eval.pass_k=[1, 4]"],
    "critic.enabled": ["critic.enabled=true"],
    "rollout.tp_size": ["rollout.tp_size=2"],
    "checkpoint.resume": ["checkpoint.resume=sometimes"],
    "run_name": ["run_name=../escape"],
}


@st.composite
def malformed(draw) -> tuple[str, list[str]]:
    if draw(st.integers(0, 9)) == 0:
        field = draw(st.sampled_from(sorted(RULES)))
        return field, RULES[field]
    path = draw(st.sampled_from(sorted(LEAVES)))
    value = draw(LEAVES[path])
    return path, [
        f"{path}={yaml.safe_dump(value, default_flow_style=True).strip().removesuffix('...').strip()}"
    ]


def test_the_generator_covers_the_tree():
    assert len(LEAVES) > 60


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(case=malformed())
def test_property_malformed_config_fails_naming_the_field(tmp_path_factory, case):
    field, overrides = case
    root = tmp_path_factory.mktemp("store")
    children = {p.pid for p in psutil.Process().children(recursive=True)}
    with pytest.raises((ValidationError, ValueError)) as info:
        main([f"storage.uri={root}", *overrides])
    message = str(info.value)
    assert field in message or field.rsplit(".", 1)[-1] in message, (overrides, message)
    assert list(Path(root).iterdir()) == [], "a malformed config wrote to storage"
    assert {p.pid for p in psutil.Process().children(recursive=True)} <= children, "a process was started"
