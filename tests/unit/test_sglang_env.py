"""SGLang in its own environment: the engine launches it with a configured interpreter."""

import sys

import pytest
from pydantic import ValidationError

from infra.config import RunConfig
from infra.rollout.engine import engine_command


def test_sglang_runs_under_the_configured_interpreter():
    cmd = engine_command("sglang", "/m", "127.0.0.1", 30000, 1, 1, {}, python="/opt/sglang-env/bin/python")
    assert cmd[:3] == ["/opt/sglang-env/bin/python", "-m", "sglang.launch_server"]
    assert engine_command("sglang", "/m", "127.0.0.1", 30000, 1, 1, {})[0] == sys.executable
    # the built-in server is this project's code: always this interpreter
    assert (
        engine_command("torch", "/m", "127.0.0.1", 30000, 1, 1, {}, python="/x/python")[0] == sys.executable
    )


def test_sglang_python_is_for_sglang_engines_only():
    gpu = {"engines": {"gpus_per_worker": 1}}
    cfg = RunConfig.model_validate(
        {"rollout": {"engine": "sglang", "sglang_python": "/opt/sglang-env/bin/python"}, "cluster": gpu}
    )
    assert cfg.rollout.sglang_python == "/opt/sglang-env/bin/python"
    with pytest.raises(ValidationError, match="rollout.sglang_python"):
        RunConfig.model_validate({"rollout": {"sglang_python": "/opt/sglang-env/bin/python"}})


def test_tensor_parallel_engines_launch_with_their_tp_size() -> None:
    cmd = engine_command("sglang", "/m", "127.0.0.1", 30000, 1, 1, {}, tp_size=2)
    assert cmd[cmd.index("--tp-size") + 1] == "2"
    assert "--tp-size" not in engine_command("sglang", "/m", "127.0.0.1", 30000, 1, 1, {})
