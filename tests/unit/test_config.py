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
    # a single-sample estimator needs no groups, but the default dynamic sampling does, and says how
    single = {
        "algorithm": {"advantage_estimator": "reinforce_plus_plus"},
        "rollout": {"n_samples_per_prompt": 1},
    }
    with pytest.raises(ValidationError, match="set rollout.dynamic_sampling=false"):
        RunConfig.model_validate(single)
    single["rollout"]["dynamic_sampling"] = False
    RunConfig.model_validate(single)
    assert RunConfig().tis_enabled and not RunConfig(mode="sync").tis_enabled
    assert RunConfig.model_validate({"mode": "sync", "algorithm": {"tis": "on"}}).tis_enabled
    assert not RunConfig.model_validate({"algorithm": {"tis": "off"}}).tis_enabled
    cfg = RunConfig.model_validate(
        {"num_rollout": 5, "algorithm": {"global_batch_size": 256, "ppo_epochs": 3}}
    )
    assert cfg.total_optimizer_steps == 5 * (1024 // 256) * 3


def _leaf_fields(model: type, prefix: str = "") -> list[tuple[str, object]]:
    from pydantic import BaseModel

    out = []
    for name, field in model.model_fields.items():
        ann = field.annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            out += _leaf_fields(ann, f"{prefix}{name}.")
        else:
            out.append((f"{prefix}{name}", field))
    return out


def _takes_float(field) -> bool:
    text = str(field.annotation)
    return "float" in text and "dict" not in text and "tuple" not in text


FLOAT_FIELDS = [path for path, field in _leaf_fields(RunConfig) if _takes_float(field)]
TIMEOUT_FIELDS = [path for path, _ in _leaf_fields(RunConfig) if path.endswith("timeout_s")]


def test_the_walk_finds_the_float_and_timeout_fields():
    assert "algorithm.lr" in FLOAT_FIELDS and "rollout.sampling.temperature" in FLOAT_FIELDS
    assert len(FLOAT_FIELDS) > 25
    assert {"rollout.request_timeout_s", "weight_sync.timeout_s", "storage.retry_timeout_s"} <= set(
        TIMEOUT_FIELDS
    )
    assert len(TIMEOUT_FIELDS) >= 7


@pytest.mark.parametrize("path", FLOAT_FIELDS)
@pytest.mark.parametrize("value", [".nan", ".inf", "-.inf", "inf", "nan"])
def test_non_finite_numbers_are_refused_everywhere(path, value):
    with pytest.raises(ValidationError, match=rf"(?s){path}.*finite number"):
        load_config(None, [f"{path}={value}"])


@pytest.mark.parametrize(
    "override,field",
    [
        ("algorithm.betas=[0.9, .inf]", "algorithm.betas"),
        ("cluster.engines.resources={node: .nan}", "cluster.engines.resources.node"),
        ("rollout.sglang_args={mem_fraction_static: .inf}", "rollout.sglang_args.mem_fraction_static"),
    ],
)
def test_non_finite_numbers_inside_containers_are_refused(override, field):
    with pytest.raises(ValidationError, match=rf"(?s){field}.*finite number"):
        load_config(None, [override])


@pytest.mark.parametrize("path", TIMEOUT_FIELDS)
def test_timeouts_must_be_positive(path):
    with pytest.raises(ValidationError, match=path):
        load_config(None, [f"{path}=-1"])
    if path == "storage.retry_timeout_s":
        # documented: 0 is one attempt, no retries
        assert load_config(None, [f"{path}=0"]).storage.retry_timeout_s == 0
    else:
        with pytest.raises(ValidationError, match=rf"(?s){path}.*greater than 0"):
            load_config(None, [f"{path}=0"])


def test_zero_storage_retry_time_means_one_attempt():
    from infra.storage.retry import StorageUnavailable, with_retries

    calls = []

    def down():
        calls.append(1)
        raise ConnectionError("endpoint down")

    with pytest.raises(StorageUnavailable, match="1 attempts"):
        with_retries(down, "read x", 0)
    assert len(calls) == 1


@pytest.mark.parametrize(
    "override,message",
    [
        ("storage.uri=", "storage.uri is empty"),
        ("storage.uri='  '", "storage.uri is empty"),
        ("rollout.sampling.temperature=1e-30", "rollout.sampling.temperature"),
        ("rollout.sampling.temperature=0", "rollout.sampling.temperature"),
        ("eval.temperature=1e-30", "eval.temperature=1e-30: use 0 for greedy"),
        ("eval.datasets=[{name: a, path: 'builtin:digit-copy', temperature: 0.001}]", "use 0 for greedy"),
        ("rollout.sampling.top_k=0", "top_k=0 keeps no token"),
        ("rollout.sampling.top_k=-2", "rollout.sampling.top_k"),
        ("cluster.ray_address=ray://host:10001", "Ray Client"),
        ("cluster.ray_address=http://host:8265", "py_modules"),
        ("model.tiny.num_heads=3", "num_heads=3 must divide model.tiny.hidden_size=64"),
        ("model.tiny.hidden_size=96 && model.tiny.num_heads=32", "heads of an even width"),  # width 3
        ("algorithm.betas=[0.9, 1.0]", "algorithm.betas"),
        ("algorithm.betas=[-0.1, 0.9]", "algorithm.betas"),
    ],
)
def test_bad_values_are_refused_naming_the_field(override, message):
    with pytest.raises(ValidationError, match=message):
        load_config(None, override.split(" && "))


def test_documented_meanings_of_edge_values():
    assert load_config(None, ["eval.temperature=0"]).eval.temperature == 0  # greedy
    sets = load_config(None, ["eval.datasets=[{name: g, path: 'builtin:digit-copy', temperature: 0}]"])
    assert sets.eval.datasets[0].temperature == 0
    assert load_config(None, ["rollout.sampling.top_k=-1"]).rollout.sampling.top_k == -1
    assert load_config(None, ["rollout.sampling.temperature=0.01"]).rollout.sampling.temperature == 0.01
    assert load_config(None, ["storage.uri=."]).storage.uri == "."
    assert load_config(None, ["cluster.ray_address=10.0.0.1:6379"]).cluster.ray_address == "10.0.0.1:6379"
    assert load_config(None, ["model.tiny.num_heads=32"]).model.tiny.num_heads == 32  # head width 2


def test_a_greedy_eval_dataset_keeps_temperature_zero():
    from infra.rollout.eval_sets import EvalSet

    cfg = load_config(None, ["eval.datasets=[{name: g, path: 'builtin:digit-copy', temperature: 0}]"])
    es = EvalSet.of(cfg.eval.datasets[0], cfg.data, {}, cfg.eval)
    assert es.temperature == 0  # not the eval.temperature default (0.6)


def test_eval_takes_all_prompts_when_the_data_holds_fewer(tmp_path):
    from infra.data.splits import train_and_eval_rows
    from infra.rollout.eval_sets import EvalSet

    data = tmp_path / "few.jsonl"
    data.write_text('{"prompt": "1:", "label": "1"}\n{"prompt": "2:", "label": "2"}\n')
    cfg = load_config(None, [f"data.eval_path={data}", "eval.num_prompts=64"])
    _, rows = train_and_eval_rows(cfg, [], {})
    assert EvalSet.default(rows, cfg.data, cfg.eval).rows == rows and len(rows) == 2


SEEDS = ("model.tiny.seed", "rollout.seed", "data.shuffle_seed", "algorithm.seed")


def _seeds(cfg) -> list[int]:
    return [cfg.model.tiny.seed, cfg.rollout.seed, cfg.data.shuffle_seed, cfg.algorithm.seed]


def test_one_seed_derives_the_four_unless_they_are_set():
    assert _seeds(RunConfig()) == [0, 1234, 7, 42]  # seed 0: the seeds each field had on its own
    assert _seeds(load_config(None, ["seed=7"])) == [7, 1241, 14, 49]
    assert _seeds(load_config(None, ["seed=4194300"])) == [4194300, 1230, 3, 38]
    assert _seeds(load_config(None, ["seed=7", "rollout.seed=5"])) == [7, 5, 14, 49]
    with pytest.raises(ValidationError, match="seed"):
        load_config(None, ["seed=-1"])


def test_a_dumped_config_rederives_its_seeds_from_seed():
    """What the Prefect form and a saved config hold: derived seeds empty, so changing `seed`
    there moves them; a seed set explicitly stays."""
    cfg = load_config(None, ["seed=7", "algorithm.seed=3"])
    tree = cfg.model_dump(mode="json")
    assert [tree["model"]["tiny"]["seed"], tree["rollout"]["seed"], tree["data"]["shuffle_seed"]] == [
        None
    ] * 3
    assert RunConfig.model_validate(tree) == cfg
    assert _seeds(RunConfig.model_validate({**tree, "seed": 8})) == [8, 1242, 15, 3]
    # a section taken from another config is derived again from this one's seed
    assert RunConfig(seed=8, rollout=cfg.rollout).rollout.seed == 1242


def test_the_checkpoint_identity_holds_the_seeds_a_run_trains_with():
    from infra.storage.checkpoints import config_hash

    explicit = RunConfig.model_validate(
        {
            "model": {"tiny": {"seed": 0}},
            "rollout": {"seed": 1234},
            "data": {"shuffle_seed": 7},
            "algorithm": {"seed": 42},
        }
    )
    assert config_hash(RunConfig()) == config_hash(explicit)  # checkpoints of explicit seeds resume
    assert config_hash(RunConfig(seed=1)) != config_hash(RunConfig())
