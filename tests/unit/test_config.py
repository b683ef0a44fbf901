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
    # the critic trains only for ppo: with another estimator it would train for nothing
    with pytest.raises(ValidationError, match=r"critic.enabled with algorithm.advantage_estimator=grpo"):
        RunConfig.model_validate({"critic": {"enabled": True}})


def test_ppo_with_critic_is_accepted_with_verl_defaults():
    cfg = RunConfig.model_validate(
        {"algorithm": {"advantage_estimator": "ppo"}, "critic": {"enabled": True}, "num_critic_only_steps": 1}
    )
    assert (cfg.algorithm.gamma, cfg.algorithm.lam, cfg.critic.cliprange_value) == (1.0, 1.0, 0.5)
    assert cfg.cluster.critic.num_workers == 2 and cfg.critic.model_path is None
    ppo = {"algorithm": {"advantage_estimator": "ppo"}, "critic": {"enabled": True}}
    with pytest.raises(ValidationError, match="cluster.critic.num_workers"):
        RunConfig.model_validate({**ppo, "cluster": {"critic": {"num_workers": 3}}})
    with pytest.raises(ValidationError, match="cluster.colocate with critic.enabled"):
        RunConfig.model_validate({**ppo, "mode": "sync", "cluster": {"colocate": True}})
    with pytest.raises(ValidationError, match="algorithm.lam"):
        RunConfig.model_validate({**ppo, "algorithm": {"advantage_estimator": "ppo", "lam": 1.5}})


def test_sglang_runs_on_cpus_or_one_gpu_per_tp_rank_and_pass_k_fits_samples():
    cpu = RunConfig.model_validate({"rollout": {"engine": "sglang", "tp_size": 2}})
    assert cpu.cluster.engines.gpus_per_worker == 0  # SGLang's CPU path
    with pytest.raises(ValidationError, match="must equal rollout.tp_size=2"):
        RunConfig.model_validate(
            {"rollout": {"engine": "sglang", "tp_size": 2}, "cluster": {"engines": {"gpus_per_worker": 1}}}
        )
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


@pytest.mark.parametrize(
    "tree,field",
    [
        ({"algorithm": {"advantage_estimator": "ppo"}}, "critic.enabled"),
        ({"algorithm": {"advantage_estimator": "gspo", "loss_agg_mode": "token-mean"}}, "loss_agg_mode"),
        ({"algorithm": {"kl_in_reward": True}}, "kl_coef"),
        ({"rollout": {"n_samples_per_prompt": 1}}, "n_samples_per_prompt"),
        (
            {"rollout": {"n_samples_per_prompt": 1, "dynamic_sampling": True},
             "algorithm": {"advantage_estimator": "reinforce_plus_plus"}},
            "dynamic_sampling",
        ),
        ({"algorithm": {"clip_ratio_c": 0.5}}, "clip_ratio_c"),
        ({"algorithm": {"advantage_estimator": "vanilla"}}, "advantage_estimator"),
        ({"critic": {"enabled": True}}, "critic.enabled"),
        ({"algorithm": {"gamma": -0.1}}, "gamma"),
    ],
)  # fmt: skip
def test_algorithm_nonsense_is_rejected_by_name(tree, field):
    with pytest.raises(ValidationError, match=field):
        RunConfig.model_validate(tree)


def test_estimator_defaults_and_derived_settings():
    assert RunConfig().algorithm.agg_mode == "token-mean"
    assert RunConfig.model_validate({"algorithm": {"advantage_estimator": "gspo"}}).algorithm.agg_mode == (
        "seq-mean-token-mean"
    )
    dr = RunConfig.model_validate({"algorithm": {"advantage_estimator": "dr_grpo"}})
    assert dr.algorithm.agg_mode == "seq-mean-token-sum-norm"
    # a single-sample estimator needs no groups
    RunConfig.model_validate(
        {"algorithm": {"advantage_estimator": "reinforce_plus_plus"}, "rollout": {"n_samples_per_prompt": 1}}
    )
    assert RunConfig().tis_enabled and not RunConfig(mode="sync").tis_enabled
    assert RunConfig.model_validate({"mode": "sync", "algorithm": {"tis": "on"}}).tis_enabled
    assert not RunConfig.model_validate({"algorithm": {"tis": "off"}}).tis_enabled
    cfg = RunConfig.model_validate(
        {"num_rollout": 5, "algorithm": {"global_batch_size": 256, "ppo_epochs": 3}}
    )
    assert cfg.total_optimizer_steps == 5 * (1024 // 256) * 3
