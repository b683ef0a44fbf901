"""SGLang's own argument parser accepts the launch command the engine actor builds."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from infra.config import LoraConfig
from infra.config_files import load_config
from infra.engines.actor import sglang_launch
from infra.engines.launch import SGLangLaunch, engine_command, launch_engine
from infra.secrets import API_KEY_ENV
from tests.sglang.conftest import SIDE, run_json, sglang_env

pytestmark = pytest.mark.sglang

REPO = Path(__file__).resolve().parents[2]


def test_gpu_config_launch_command_parses_to_what_we_meant(sglang_python: str):
    cfg = load_config(REPO / "configs" / "gpu-grpo.yaml")
    gpu = SGLangLaunch(tp_size=2)
    cmd = engine_command(
        "sglang", cfg.model.path, "10.1.2.3", 30123, 4321, 4, cfg.rollout.sglang_args, sglang=gpu
    )
    parsed = run_json(sglang_python, "parse_launch.py", cmd)
    assert {k: parsed[k] for k in ("model_path", "host", "port", "random_seed", "tp_size")} == {
        "model_path": cfg.model.path,
        "host": "10.1.2.3",
        "port": 30123,
        "random_seed": 4321,
        "tp_size": 2,
    }
    assert parsed["mem_fraction_static"] == float(cfg.rollout.sglang_args["mem-fraction-static"])
    assert parsed["skip_server_warmup"] and parsed["weight_version"] == "0"
    assert not parsed["sleep_on_idle"] and parsed["device"] is None  # GPUs: SGLang's defaults


def test_cpu_colocated_and_keyed_launch_commands_parse_to_what_we_meant(sglang_python: str, tmp_path):
    cfg = load_config(REPO / "configs" / "sglang-cpu.yaml")
    secrets = tmp_path / "secrets.yaml"
    secrets.write_text('api-key: "k-123"\n')  # as launch_engine writes it
    cpu = engine_command(
        "sglang",
        "/m",
        "127.0.0.1",
        30000,
        1,
        1,
        cfg.rollout.sglang_args,
        sglang=sglang_launch(cfg),
        config_file=str(secrets),
    )
    parsed = run_json(sglang_python, "parse_launch.py", cpu)
    assert parsed["device"] == "cpu" and parsed["attention_backend"] == "torch_native"
    assert parsed["disable_cuda_graph"] and parsed["disable_overlap_schedule"] and parsed["sleep_on_idle"]
    assert parsed["api_key"] == "k-123" and parsed["dtype"] == "float32"
    colocated = engine_command("sglang", "/m", "h", 1, 0, 1, {}, sglang=SGLangLaunch(colocate=True))
    parsed = run_json(sglang_python, "parse_launch.py", colocated)
    assert parsed["enable_memory_saver"] and parsed["enable_weights_cpu_backup"]


def test_a_key_with_a_leading_dash_is_refused_before_sglang_sees_it(sglang_python, tmp_path, monkeypatch):
    """SGLang's config file merger hands each value to argparse as its own argv word, so a key
    starting with '-' reads as a flag (the assumption the guard in launch_engine rests on)."""
    secrets = tmp_path / "secrets.yaml"
    secrets.write_text('api-key: "-k123"\n')
    cmd = engine_command("sglang", "/m", "h", 1, 0, 1, {}, sglang=SGLangLaunch(), config_file=str(secrets))
    done = subprocess.run(
        [sglang_python, str(SIDE / "parse_launch.py")],
        input=json.dumps(cmd),
        env=sglang_env(),
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode != 0 and "--api-key: expected one argument" in done.stderr
    monkeypatch.setenv(API_KEY_ENV, "-k123")
    with pytest.raises(ValueError, match=API_KEY_ENV):
        launch_engine("sglang", "/m", "127.0.0.1", 1, seed=0, threads=1)


def _lora_cfg(base: str, sync: str, gpus: int):
    cfg = load_config(REPO / "configs" / base)
    return cfg.model_copy(
        update={
            "model": cfg.model.model_copy(
                update={"lora": LoraConfig(r=16, target_modules=["q_proj", "v_proj", "down_proj"])}
            ),
            "weight_sync": cfg.weight_sync.model_copy(update={"lora": sync}),
            "cluster": cfg.cluster.model_copy(
                update={"engines": cfg.cluster.engines.model_copy(update={"gpus_per_worker": gpus})}
            ),
        }
    )


@pytest.mark.parametrize("gpus,backend", [(0, "torch_native"), (1, "csgmv")], ids=["cpu", "gpu"])
def test_adapter_sync_launches_with_lora_enabled(sglang_python: str, gpus: int, backend: str):
    """Two adapters per batch (the outgoing and incoming versions during a switch); on CPU the
    torch-native LoRA backend, on GPUs SGLang's default."""
    cfg = _lora_cfg("sglang-cpu.yaml", "adapter", gpus)
    cmd = engine_command("sglang", "/m", "h", 1, 0, 1, cfg.rollout.sglang_args, sglang=sglang_launch(cfg))
    parsed = run_json(sglang_python, "parse_launch.py", cmd)
    assert parsed["enable_lora"] and parsed["max_lora_rank"] == 16 and parsed["max_loras_per_batch"] == 2
    assert sorted(parsed["lora_target_modules"]) == ["down_proj", "q_proj", "v_proj"]
    assert parsed["lora_backend"] == backend


def test_merged_sync_launches_without_lora(sglang_python: str):
    cfg = _lora_cfg("sglang-cpu.yaml", "merged", 0)
    cmd = engine_command("sglang", "/m", "h", 1, 0, 1, cfg.rollout.sglang_args, sglang=sglang_launch(cfg))
    assert not [flag for flag in cmd if flag.startswith("--") and "lora" in flag]
    parsed = run_json(sglang_python, "parse_launch.py", cmd)
    assert not parsed["enable_lora"] and parsed["max_lora_rank"] is None
