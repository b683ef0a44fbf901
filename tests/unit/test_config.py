import pytest
from pydantic import ValidationError

from infra.config import RunConfig
from infra.config_files import apply_override, load_config


def test_defaults_are_the_tiny_demo():
    cfg = RunConfig()
    assert cfg.cluster.trainer.num_workers == 2
    assert cfg.cluster.engines.num_workers == 1
    assert cfg.rollout.engine == "torch"
    assert cfg.global_batch_size == cfg.rollout.prompts_per_rollout * cfg.rollout.n_samples_per_prompt


def test_every_field_is_documented_for_the_ui_form():
    def walk(model_cls, prefix=""):
        for name, field in model_cls.model_fields.items():
            assert field.description, f"{prefix}{name} has no description"
            ann = field.annotation
            if isinstance(ann, type) and hasattr(ann, "model_fields"):
                walk(ann, f"{prefix}{name}.")

    walk(RunConfig)


def test_unknown_field_is_rejected_by_name():
    with pytest.raises(ValidationError, match="algorithm.lrr"):
        RunConfig.model_validate({"algorithm": {"lrr": 1.0}})


def test_batch_must_divide_rollout():
    with pytest.raises(ValidationError, match="global_batch_size"):
        RunConfig.model_validate({"algorithm": {"global_batch_size": 100}})
    with pytest.raises(ValidationError, match="num_workers"):
        RunConfig.model_validate(
            {"algorithm": {"global_batch_size": 32}, "cluster": {"trainer": {"num_workers": 3}}}
        )


def test_critic_only_steps_are_validated():
    with pytest.raises(ValidationError, match="num_critic_only_steps"):
        RunConfig(num_critic_only_steps=2)
    with pytest.raises(ValidationError, match="critic.enabled"):
        RunConfig.model_validate({"critic": {"enabled": True}})


def test_sglang_needs_gpus_and_pass_k_fits_samples():
    with pytest.raises(ValidationError, match="sglang"):
        RunConfig.model_validate({"rollout": {"engine": "sglang"}})
    with pytest.raises(ValidationError, match="pass_k"):
        RunConfig.model_validate({"eval": {"n_samples": 2, "pass_k": [1, 4]}})


def test_bad_run_name_and_mode():
    with pytest.raises(ValidationError, match="run_name"):
        RunConfig(run_name="../escape")
    with pytest.raises(ValidationError, match="mode"):
        RunConfig(mode="sometimes")


def test_file_then_overrides(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text("num_rollout: 5\nalgorithm:\n  lr: 0.01\n")
    cfg = load_config(f, ["algorithm.lr=1e-4", "rollout.sampling.stop=['x']", "run_name=abc"])
    assert cfg.num_rollout == 5
    assert cfg.algorithm.lr == pytest.approx(1e-4)
    assert cfg.rollout.sampling.stop == ["x"]
    assert cfg.run_name == "abc"


def test_override_errors_name_the_problem(tmp_path):
    with pytest.raises(ValueError, match="key.path=value"):
        apply_override({}, "novalue")
    with pytest.raises(ValueError, match="'num_rollout' is a value"):
        apply_override({"num_rollout": 3}, "num_rollout.x=1")
    with pytest.raises(FileNotFoundError, match="missing.yaml"):
        load_config(tmp_path / "missing.yaml")
    (tmp_path / "list.yaml").write_text("- 1\n")
    with pytest.raises(ValueError, match="list.yaml"):
        load_config(tmp_path / "list.yaml")


def test_config_reference_is_current():
    from pathlib import Path

    from infra.config_docs import render

    doc = Path(__file__).resolve().parents[2] / "docs" / "CONFIG.md"
    assert doc.read_text() == render(), "regenerate: python -m infra.config_docs > docs/CONFIG.md"


def test_shipped_configs_parse():
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    files = sorted((root / "configs").glob("*.yaml"))
    assert files, "no shipped configs found"
    for f in files:
        load_config(f)
