"""SGLang in its own environment: the engine launches it with a configured interpreter."""

import sys
import tempfile
import time

import pytest
from pydantic import ValidationError

from infra.config import RunConfig
from infra.engines.launch import SGLangLaunch, cpu_binding, engine_command, forget_secrets, launch_engine
from infra.rollout.batch import weight_version_of
from infra.secrets import API_KEY_ENV


def test_sglang_runs_under_the_configured_interpreter():
    venv = SGLangLaunch(python="/opt/sglang-env/bin/python")
    cmd = engine_command("sglang", "/m", "127.0.0.1", 30000, 1, 1, {}, sglang=venv)
    assert cmd[:3] == ["/opt/sglang-env/bin/python", "-m", "sglang.launch_server"]
    assert engine_command("sglang", "/m", "127.0.0.1", 30000, 1, 1, {})[0] == sys.executable
    # the built-in server is this project's code: always this interpreter
    assert (
        engine_command("torch", "/m", "127.0.0.1", 30000, 1, 1, {}, sglang=SGLangLaunch(python="/x/python"))[
            0
        ]
        == sys.executable
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
    cmd = engine_command("sglang", "/m", "127.0.0.1", 30000, 1, 1, {}, sglang=SGLangLaunch(tp_size=2))
    assert cmd[cmd.index("--tp-size") + 1] == "2"
    assert "--tp-size" not in engine_command("sglang", "/m", "127.0.0.1", 30000, 1, 1, {})


def _flag(cmd: list[str], name: str) -> str:
    return cmd[cmd.index(name) + 1]


def test_a_cpu_engine_launches_sglangs_cpu_path_and_sleeps_when_idle():
    cpu = engine_command("sglang", "/m", "127.0.0.1", 1, 7, 1, {}, sglang=SGLangLaunch(cpu=True))
    assert _flag(cpu, "--device") == "cpu" and _flag(cpu, "--attention-backend") == "torch_native"
    assert {"--disable-cuda-graph", "--disable-overlap-schedule", "--sleep-on-idle"} <= set(cpu)
    gpu = engine_command("sglang", "/m", "127.0.0.1", 1, 7, 1, {}, sglang=SGLangLaunch())
    assert "--device" not in gpu and "--sleep-on-idle" not in gpu
    asked = engine_command("sglang", "/m", "h", 1, 7, 1, {}, sglang=SGLangLaunch(sleep_on_idle=True))
    assert "--sleep-on-idle" in asked
    for cmd in (cpu, gpu):  # every launch: our readiness wait, and the run's first version
        assert "--skip-server-warmup" in cmd and _flag(cmd, "--weight-version") == "0"
        assert _flag(cmd, "--random-seed") == "7"


def test_colocated_gpu_engines_can_free_and_restore_their_memory():
    cmd = engine_command("sglang", "/m", "h", 1, 0, 1, {}, sglang=SGLangLaunch(colocate=True))
    assert {"--enable-memory-saver", "--enable-weights-cpu-backup"} <= set(cmd)
    # CUDA only (torch_memory_saver): a CPU engine is launched without them
    cpu = engine_command("sglang", "/m", "h", 1, 0, 1, {}, sglang=SGLangLaunch(colocate=True, cpu=True))
    assert "--enable-memory-saver" not in cpu


def test_the_api_key_reaches_sglang_in_a_private_file_never_the_command_line(tmp_path, monkeypatch):
    monkeypatch.setenv(API_KEY_ENV, "sentinel-key")
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    # stands in for `python -m sglang.launch_server`: prints its argv, the config file, the
    # file's mode and the key's variable, as SGLang prints its arguments at start
    fake = tmp_path / "fake" / "sglang"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("")
    (fake / "launch_server.py").write_text(
        "import os, sys\n"
        "path = sys.argv[sys.argv.index('--config') + 1]\n"
        "print(' '.join(sys.argv), open(path).read(), oct(os.stat(path).st_mode & 0o777),\n"
        "      os.environ.get('PRL_ENGINE_API_KEY'), flush=True)\n"
    )
    monkeypatch.setenv("PYTHONPATH", str(tmp_path / "fake"))
    log = tmp_path / "engine.log"
    launch = SGLangLaunch(python=sys.executable, cpu=True)
    proc = launch_engine("sglang", "/m", "127.0.0.1", 1, seed=0, threads=1, log_path=str(log), sglang=launch)
    assert proc.wait(60) == 0
    deadline = time.monotonic() + 10
    while "0o600" not in log.read_text() and time.monotonic() < deadline:
        time.sleep(0.05)  # the copier drains the pipe into the log
    text = log.read_text()
    assert "sentinel-key" not in text and "sentinel-key" not in " ".join(proc.args)
    assert 'api-key: "<redacted>"' in text and "0o600" in text
    assert text.rstrip().endswith("None")  # the key's variable is not passed on to SGLang
    forget_secrets(proc)
    assert not list(tmp_path.glob("prl-sglang-*"))


def test_cpu_ranks_of_a_tp_engine_split_the_cores():
    assert cpu_binding([0, 1], 2) == "0|1"
    assert cpu_binding(list(range(8)), 2) == "0-3|4-7"
    assert cpu_binding([3], 2) == "3|3"  # fewer cores than ranks: they share


def test_a_sample_weight_version_is_the_runs_integer_or_a_clear_error():
    assert weight_version_of("3") == 3 and weight_version_of(4) == 4
    # SGLang's own initial version, on a server not launched by the run
    with pytest.raises(ValueError, match="weight_version 'default'.*--weight-version 0"):
        weight_version_of("default")


def test_the_builtin_engine_waits_for_its_weight_group_as_long_as_the_run_says():
    cmd = engine_command("torch", "/m", "h", 1, 0, 1, {}, group_timeout_s=7.5)
    assert cmd[cmd.index("--group-timeout-s") + 1] == "7.5"
    assert "--group-timeout-s" not in engine_command("torch", "/m", "h", 1, 0, 1, {})
