"""Launching and stopping one engine server process (no Ray here: the caller places it).

The server is a child that dies with its parent (PR_SET_PDEATHSIG), so an engine never
outlives the actor or test that started it, even when that one is SIGKILLed.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import psutil

from infra.engines.client import EngineClient, EngineError
from infra.lifetime import die_with_parent
from infra.retry import poll
from infra.secrets import API_KEY_ENV

_REPO_ROOT = str(Path(__file__).resolve().parents[2])
SGLANG_VENV_PYTHON = ".venv-sglang/bin/python"  # what `make sglang-venv` builds
# A server answers /health within a poll of being up: the run waits on this for its engines.
HEALTH_POLL_S = 0.05


class EngineProcess(subprocess.Popen):
    """A launched server; remembers its log so failures can quote it."""

    log_path: str | None = None
    config_dir: str | None = None  # the private config file's folder, until the server is up
    host: str = ""
    port: int = 0  # 0: the server binds a free port itself (see serving_url)


@dataclass(frozen=True)
class SGLangLaunch:
    """How an SGLang server is started, beyond the model and address.

    `cpu`: SGLang's CPU path (torch-native attention, no CUDA graphs, no overlap schedule):
    what runs on machines without a GPU, and in this project's tests. `colocate`: the engine
    shares its GPU with a trainer rank, so it must be able to free its memory
    (`--enable-memory-saver`, CUDA only) and get its weights back afterwards
    (`--enable-weights-cpu-backup`). `sleep_on_idle`: the idle scheduler sleeps instead of
    polling (on CPU it would hold ~0.6 of a core; None: on for CPU, off on GPUs).
    `lora_rank` and `lora_targets`: serve LoRA adapters loaded at run time, of at most that
    rank on those modules (0: no LoRA).
    """

    python: str = ""
    tp_size: int = 1
    cpu: bool = False
    colocate: bool = False
    sleep_on_idle: bool | None = None
    lora_rank: int = 0
    lora_targets: tuple[str, ...] = ()


def sglang_interpreter(configured: str) -> str:
    """`rollout.sglang_python`, resolved: empty means the interpreter `make sglang-venv`
    builds in this repository where it exists, else this process's interpreter."""
    if configured:
        return configured
    venv = Path(_REPO_ROOT) / SGLANG_VENV_PYTHON
    return str(venv) if venv.exists() else sys.executable


def engine_command(
    kind: Literal["torch", "sglang"],
    model_path: str,
    host: str,
    port: int,
    seed: int,
    threads: int,
    extra_args: dict,
    *,
    sglang: SGLangLaunch | None = None,
    config_file: str | None = None,
    group_timeout_s: float | None = None,
) -> list[str]:
    """The server's command line. `sglang.python` runs SGLang (default: this interpreter), so
    SGLang can live in its own environment when its torch pin differs from the trainer's.
    `config_file`: an SGLang YAML config with what must not appear on a command line
    (the API key). `group_timeout_s`: how long the built-in server's weight-group joins and
    broadcasts wait for their peers (SGLang's take no such setting)."""
    common = ["--model-path", model_path, "--host", host, "--port", str(port)]
    if kind == "torch":
        return [
            sys.executable,
            "-m",
            "infra.engine_server.server",
            *common,
            "--seed",
            str(seed),
            "--threads",
            str(threads),
            *(["--group-timeout-s", str(group_timeout_s)] if group_timeout_s else []),
        ]
    if kind == "sglang":
        launch = sglang or SGLangLaunch()
        interpreter = launch.python or sys.executable
        tp = launch.tp_size
        # the built-in server's first version too: a sample's version is always an integer
        flags = ["--random-seed", str(seed), "--weight-version", "0"]
        # the run waits for /health itself, and its first weight sync exercises the model
        flags.append("--skip-server-warmup")
        if tp != 1:
            flags += ["--tp-size", str(tp)]
        if launch.cpu:
            flags += [
                "--device",
                "cpu",
                "--attention-backend",
                "torch_native",
                "--disable-cuda-graph",
                "--disable-overlap-schedule",
            ]
        if launch.colocate and not launch.cpu:
            # CUDA only: the memory saver pages GPU memory out through torch_memory_saver
            flags += ["--enable-memory-saver", "--enable-weights-cpu-backup"]
        if launch.cpu if launch.sleep_on_idle is None else launch.sleep_on_idle:
            flags.append("--sleep-on-idle")
        flags += _lora_flags(launch)
        if config_file:
            flags += ["--config", config_file]
        return [interpreter, "-m", "sglang.launch_server", *common, *flags, *_cli_flags(extra_args)]
    raise ValueError(f"rollout.engine: unknown engine kind {kind!r} (torch or sglang)")


# Adapters one batch may use, the base model counting as one: a weight-version switch has
# the outgoing and the incoming version's requests in flight together.
MAX_LORAS_PER_BATCH = 2


def _lora_flags(launch: SGLangLaunch) -> list[str]:
    if not launch.lora_rank:
        return []
    flags = ["--enable-lora", "--max-lora-rank", str(launch.lora_rank)]
    flags += ["--lora-target-modules", *launch.lora_targets]
    flags += ["--max-loras-per-batch", str(MAX_LORAS_PER_BATCH)]
    if launch.cpu:
        # SGLang's default backend (csgmv) and triton run triton kernels: CUDA only
        flags += ["--lora-backend", "torch_native"]
    return flags


def _cli_flags(extra_args: dict) -> list[str]:
    """`{"mem_fraction_static": 0.1, "enable_x": True}` as SGLang's command-line flags."""
    flags: list[str] = []
    for key, value in extra_args.items():
        flag = f"--{key.replace('_', '-')}"
        if value is True:
            flags.append(flag)
        elif value is not False:
            flags += [flag, str(value)]
    return flags


def cpu_binding(cores: list[int], tp_size: int) -> str:
    """SGLang's `SGLANG_CPU_OMP_THREADS_BIND` for `tp_size` CPU ranks over `cores`: an equal
    run of cores per rank ("0-3|4-7"), or one core each, shared, when there are fewer cores
    than ranks. SGLang refuses more CPU ranks than NUMA nodes unless it is set."""
    cores = sorted(cores)
    per_rank = max(1, len(cores) // tp_size)
    spans = []
    for r in range(tp_size):
        chunk = cores[r * per_rank : (r + 1) * per_rank] or [cores[r % len(cores)]]
        contiguous = chunk[-1] - chunk[0] == len(chunk) - 1
        spans.append(f"{chunk[0]}-{chunk[-1]}" if contiguous and len(chunk) > 1 else str(chunk[0]))
    return "|".join(spans)


def sglang_env(env: dict[str, str], cpu: bool, tp_size: int = 1) -> dict[str, str]:
    """The environment of an SGLang server: no engine key (it goes in a config file), a
    `/health` that answers from the HTTP process, and SGLang's CPU engine where asked.

    SGLang's own `/health` runs a one-token generation and waits >= 1 s for it (up to 20 s
    under load): as a liveness probe, polled every second, it would itself load the server
    and time out on a busy one. Answered by the HTTP process, it says the server is up;
    a scheduler stuck in a forward pass is SGLang's watchdog's to kill (`--watchdog-timeout`),
    after which /health is refused and the run restarts the engine."""
    env = {k: v for k, v in env.items() if k != API_KEY_ENV}
    env["SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION"] = "false"
    if cpu:
        env["SGLANG_USE_CPU_ENGINE"] = "1"
        if tp_size > 1:
            env.setdefault("SGLANG_CPU_OMP_THREADS_BIND", cpu_binding(list(os.sched_getaffinity(0)), tp_size))
    return env


def launch_engine(
    kind: Literal["torch", "sglang"],
    model_path: str,
    host: str,
    port: int,
    *,
    seed: int,
    threads: int,
    extra_args: dict | None = None,
    log_path: str | None = None,
    sglang: SGLangLaunch | None = None,
    group_timeout_s: float | None = None,
) -> EngineProcess:
    """Start an engine server; its stdout and stderr go to `log_path` (or are discarded).

    The run's engine API key (env PRL_ENGINE_API_KEY) reaches the built-in server through
    its environment and SGLang through a private config file (mode 0600, deleted once the
    server is up): never a command line, which `ps` shows. SGLang prints its arguments at
    start, so its output passes through a filter that redacts the key before the log."""
    key = os.environ.get(API_KEY_ENV) or None
    redact = key if kind == "sglang" else None
    config_dir, config_file = _secrets_file(key) if redact else (None, None)
    cmd = engine_command(
        kind,
        model_path,
        host,
        port,
        seed,
        threads,
        extra_args or {},
        sglang=sglang,
        config_file=config_file,
        group_timeout_s=group_timeout_s,
    )
    env = _engine_env(kind, threads, sglang)
    proc = _spawn(cmd, env, log_path, piped=bool(redact))
    proc.log_path = log_path
    proc.config_dir = config_dir
    proc.host, proc.port = host, port
    if redact:
        threading.Thread(
            target=_copy_redacted, args=(proc.stdout, log_path, redact), daemon=True, name="engine-log"
        ).start()
    return proc


def _secrets_file(key: str) -> tuple[str, str]:
    """A private SGLang config file holding the API key: its folder and its path."""
    if key.startswith("-"):
        # SGLang turns the file's values into argv ("--api-key", key) and argparse then
        # takes the key for a flag: the server would exit at start with a usage message
        raise ValueError(f"{API_KEY_ENV} starts with '-', which SGLang cannot read: choose another key")
    config_dir = tempfile.mkdtemp(prefix="prl-sglang-")  # 0700: this user only
    config_file = os.path.join(config_dir, "secrets.yaml")
    fd = os.open(config_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(f"api-key: {json.dumps(key)}\n")  # a JSON string is a YAML string
    return config_dir, config_file


def _engine_env(
    kind: Literal["torch", "sglang"], threads: int, sglang: SGLangLaunch | None
) -> dict[str, str]:
    """This process's environment with the server's thread counts, and SGLang's settings."""
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    # the built-in server is a module of this repository, wherever the caller runs from
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [_REPO_ROOT, env.get("PYTHONPATH")]))
    if kind == "sglang":
        launch = sglang or SGLangLaunch()
        env = sglang_env(env, cpu=launch.cpu, tp_size=launch.tp_size)
    return env


def _spawn(cmd: list[str], env: dict[str, str], log_path: str | None, piped: bool) -> EngineProcess:
    """The server process, its output piped (for a filter to read) or into `log_path`."""
    out = subprocess.PIPE if piped else _log_file(log_path)
    try:
        return EngineProcess(
            cmd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            preexec_fn=die_with_parent(),
            start_new_session=False,
        )
    finally:
        if log_path and not piped:
            out.close()


def _log_file(log_path: str | None):
    return open(log_path, "ab") if log_path else subprocess.DEVNULL  # noqa: SIM115 (the child owns it)


def _copy_redacted(stream, log_path: str | None, secret: str) -> None:
    """The server's output, line by line, into its log with `secret` replaced (to EOF)."""
    needle, mask = secret.encode(), b"<redacted>"
    with contextlib.ExitStack() as stack:
        log = stack.enter_context(open(log_path, "ab", buffering=0)) if log_path else None
        for line in iter(stream.readline, b""):
            if log is not None:
                log.write(line.replace(needle, mask))
    stream.close()


def forget_secrets(proc: subprocess.Popen) -> None:
    """Delete the launch's private config file (the server has read it once it is up)."""
    config_dir = getattr(proc, "config_dir", None)
    if config_dir:
        shutil.rmtree(config_dir, ignore_errors=True)
        proc.config_dir = None


def stop_engine(proc: subprocess.Popen, timeout_s: float = 10) -> None:
    """SIGTERM, then SIGKILL after `timeout_s`; returns once the process is reaped."""
    forget_secrets(proc)
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _log_tail(log_path: str | None, max_chars: int = 4000) -> str:
    if not log_path or not os.path.exists(log_path):
        return "(no log)"
    with open(log_path, "rb") as f:
        f.seek(max(0, os.path.getsize(log_path) - max_chars))
        return f.read().decode(errors="replace")


def wait_until_healthy(url: str, proc: subprocess.Popen, timeout_s: float) -> None:
    """Poll /health until it answers; fail at once, with the log tail, if the server exits."""
    log_path = getattr(proc, "log_path", None)

    def up(client: EngineClient) -> bool:
        if proc.poll() is not None:
            raise EngineError(f"engine at {url} exited with code {proc.returncode}:\n{_log_tail(log_path)}")
        return client.health()

    with EngineClient(url) as client:
        healthy = poll(lambda: up(client), timeout_s, HEALTH_POLL_S)
    if not healthy:
        stop_engine(proc)
        raise EngineError(f"engine at {url} not healthy after {timeout_s} s:\n{_log_tail(log_path)}")
    forget_secrets(proc)


def serving_url(proc: EngineProcess, timeout_s: float) -> str:
    """The URL of a launched server once it answers /health. A server launched on port 0
    binds a free port itself; the port is the one its own process listens on at its host
    (the HTTP server's: SGLang's scheduler and the built-in server's groups listen from
    other processes or only later)."""
    deadline = time.monotonic() + timeout_s

    def bound() -> int | None:
        if proc.poll() is not None:
            raise EngineError(f"engine exited with code {proc.returncode}:\n{_log_tail(proc.log_path)}")
        return _listening_port(proc.pid, proc.host)

    port = proc.port or poll(bound, timeout_s, HEALTH_POLL_S)
    if not port:
        stop_engine(proc)
        raise EngineError(f"engine bound no port within {timeout_s} s:\n{_log_tail(proc.log_path)}")
    url = f"http://{proc.host}:{port}"
    wait_until_healthy(url, proc, max(0.0, deadline - time.monotonic()))
    return url


def _listening_port(pid: int, host: str) -> int | None:
    try:
        sockets = psutil.Process(pid).net_connections("tcp")
    except psutil.NoSuchProcess:
        return None
    ports = sorted({c.laddr.port for c in sockets if c.status == psutil.CONN_LISTEN and c.laddr.ip == host})
    if len(ports) > 1:
        raise EngineError(f"engine process {pid} listens on several ports at {host}: {ports}")
    return ports[0] if ports else None
