"""prefect.yaml: every deployment's parameters are a valid RunConfig, and the nightly
deployment is scheduled, exclusive and resuming."""

from pathlib import Path

import pytest
import yaml

from infra.config import RunConfig
from infra.config_files import load_config

ROOT = Path(__file__).resolve().parents[2]


def deployments() -> dict[str, dict]:
    spec = yaml.safe_load((ROOT / "prefect.yaml").read_text())
    return {d["name"]: d for d in spec["deployments"]}


def test_prefect_yaml_is_what_prefect_deploy_reads():
    from prefect.cli.deploy._models import PrefectYamlModel

    model = PrefectYamlModel.model_validate(yaml.safe_load((ROOT / "prefect.yaml").read_text()))
    assert {d.name for d in model.deployments} == {"tiny-demo", "nightly", "gpu-grpo"}
    (pull,) = model.pull
    assert "prefect.deployments.steps.set_working_directory" in pull


@pytest.mark.parametrize("name", ["tiny-demo", "nightly", "gpu-grpo"])
def test_deployment_parameters_are_valid_configs(name):
    d = deployments()[name]
    assert set(d["parameters"]) == {"config"}, "the flow's only parameter is `config`"
    RunConfig.model_validate(d["parameters"]["config"])
    module, _, func = d["entrypoint"].partition(":")
    assert (ROOT / module).is_file() and f"def {func}(" in (ROOT / module).read_text()
    assert d["work_pool"]["job_variables"]["env"]["PYTHONPATH"], "Ray workers and the flow need the code"


def test_nightly_resumes_one_run_at_a_time():
    d = deployments()["nightly"]
    assert d["schedules"] == [{"cron": "0 2 * * *", "timezone": "UTC"}]
    assert d["concurrency_limit"]["limit"] == 1
    assert d["concurrency_limit"]["collision_strategy"] in {"ENQUEUE", "CANCEL_NEW"}
    cfg = RunConfig.model_validate(d["parameters"]["config"])
    assert cfg.checkpoint.resume == "auto"
    assert cfg.iterations_per_run and cfg.iterations_per_run < cfg.num_rollout  # a slice per night
    assert d["parameters"]["config"]["run_name"] == "nightly"  # fixed, not defaulted


def test_tiny_demo_is_small_and_gpu_recipe_says_so():
    tiny = RunConfig.model_validate(deployments()["tiny-demo"]["parameters"]["config"])
    assert tiny.num_rollout <= 10 and tiny.rollout.engine == "torch"
    # two runs from the UI must not mix outputs, nor refuse: each starts over
    assert tiny.checkpoint.resume == "fresh"
    assert load_config(ROOT / "configs" / "tiny-demo.yaml").checkpoint.resume == "fresh"
    assert "checkpoint.resume=fresh" in (ROOT / "Makefile").read_text()
    gpu = deployments()["gpu-grpo"]
    assert "GPU" in gpu["description"]
    # the recipe is the shipped config file, so the two cannot drift apart
    assert RunConfig.model_validate(gpu["parameters"]["config"]) == load_config(
        ROOT / "configs" / "gpu-grpo.yaml"
    )
    assert RunConfig.model_validate(gpu["parameters"]["config"]).rollout.engine == "sglang"
