"""SGLang's own argument parser accepts the launch command the engine actor builds."""

from __future__ import annotations

from pathlib import Path

import pytest

from infra.config_files import load_config
from infra.rollout.engine import engine_command
from tests.sglang.conftest import run_json

pytestmark = pytest.mark.sglang

REPO = Path(__file__).resolve().parents[2]


def test_gpu_config_launch_command_parses_to_what_we_meant(sglang_python: str):
    cfg = load_config(REPO / "configs" / "gpu-grpo.yaml")
    cmd = engine_command(
        "sglang", cfg.model.path, "10.1.2.3", 30123, 4321, 4, cfg.rollout.sglang_args, tp_size=2
    )
    parsed = run_json(sglang_python, "parse_launch.py", cmd)
    assert parsed == {
        "model_path": cfg.model.path,
        "host": "10.1.2.3",
        "port": 30123,
        "random_seed": 4321,
        "tp_size": 2,
        "mem_fraction_static": float(cfg.rollout.sglang_args["mem-fraction-static"]),
    }
