"""Launching and stopping one engine server process (no Ray here: the caller places it).

The server is a child that dies with its parent (PR_SET_PDEATHSIG), so an engine never
outlives the actor or test that started it, even when that one is SIGKILLed.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Literal

from infra.rollout.client import EngineClient, EngineError

_PR_SET_PDEATHSIG = 1
_REPO_ROOT = str(Path(__file__).resolve().parents[2])
# A server answers /health within a poll of being up: the run waits on this for its engines.
HEALTH_POLL_S = 0.05


class EngineProcess(subprocess.Popen):
    """A launched server; remembers its log so failures can quote it."""

    log_path: str | None = None


def _die_with_parent() -> None:
    # Runs in the child between fork and exec. The signal fires when the launching *thread*
    # exits: launch from a thread that lives as long as the engine should (the main one).
    if sys.platform.startswith("linux"):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def engine_command(
    kind: Literal["torch", "sglang"],
    model_path: str,
    host: str,
    port: int,
    seed: int,
    threads: int,
    extra_args: dict,
    python: str = "",
    tp_size: int = 1,
) -> list[str]:
    """The server's command line. `python` runs SGLang (default: this interpreter), so SGLang
    can live in its own environment when its torch pin differs from the trainer's."""
    common = ["--model-path", model_path, "--host", host, "--port", str(port)]
    if kind == "torch":
        return [
            sys.executable,
            "-m",
            "infra.rollout.server",
            *common,
            "--seed",
            str(seed),
            "--threads",
            str(threads),
        ]
    if kind == "sglang":
        # GPU only: SGLang needs CUDA and cannot run on the CPU machines this is tested on.
        flags: list[str] = []
        for key, value in extra_args.items():
            flag = f"--{key.replace('_', '-')}"
            if value is True:
                flags.append(flag)
            elif value is not False:
                flags += [flag, str(value)]
        interpreter = python or sys.executable
        parallel = ["--tp-size", str(tp_size)] if tp_size != 1 else []
        return [
            interpreter,
            "-m",
            "sglang.launch_server",
            *common,
            "--random-seed",
            str(seed),
            *parallel,
            *flags,
        ]
    raise ValueError(f"rollout.engine: unknown engine kind {kind!r} (torch or sglang)")


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
    python: str = "",
    tp_size: int = 1,
) -> EngineProcess:
    """Start an engine server; its stdout and stderr go to `log_path` (or are discarded)."""
    cmd = engine_command(kind, model_path, host, port, seed, threads, extra_args or {}, python, tp_size)
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    # the built-in server is a module of this repository, wherever the caller runs from
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [_REPO_ROOT, env.get("PYTHONPATH")]))
    log = open(log_path, "ab") if log_path else subprocess.DEVNULL  # noqa: SIM115 (the child owns it)
    try:
        proc = EngineProcess(
            cmd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            preexec_fn=_die_with_parent,
            start_new_session=False,
        )
    finally:
        if log_path:
            log.close()
    proc.log_path = log_path
    return proc


def stop_engine(proc: subprocess.Popen, timeout_s: float = 10) -> None:
    """SIGTERM, then SIGKILL after `timeout_s`; returns once the process is reaped."""
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
    client = EngineClient(url)
    deadline = time.monotonic() + timeout_s
    while not client.health():
        if proc.poll() is not None:
            raise EngineError(f"engine at {url} exited with code {proc.returncode}:\n{_log_tail(log_path)}")
        if time.monotonic() > deadline:
            stop_engine(proc)
            raise EngineError(f"engine at {url} not healthy after {timeout_s} s:\n{_log_tail(log_path)}")
        time.sleep(HEALTH_POLL_S)
