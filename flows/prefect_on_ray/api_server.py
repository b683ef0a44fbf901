"""Where the run's Prefect API is, for processes that are not the flow's own."""

from __future__ import annotations

import atexit
import os
import secrets
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager

import httpx
from prefect.settings import PREFECT_API_KEY, PREFECT_API_URL, get_current_settings, temporary_settings

from infra.lifetime import die_with_parent
from infra.retry import poll
from infra.secrets import API_KEY_ENV

# Prefect waits 20 s by default; a busy 2-core machine (a CI run, other jobs) can need more
STARTUP_TIMEOUT_S = 120
# Ray starts its workers (trainer ranks, engines, task runs) at niceness 15, below the driver
# and Ray's own daemons; the API server, started by the driver at 0, would take the CPU from
# them whenever both want it. Its work in the loop is recording what task runs report, which
# nothing waits for, so once it answers it runs below the workers.
SERVER_NICENESS = 19
# Prefect's task run recorder writes every state event it receives in a transaction of its
# own by default (batch size 1): three a task run, most of the server's CPU in a profile of
# the loop (117 -> 54 CPU-ms an iteration at 8 prompts x 8 samples, bench.cpu_budget). Batched,
# the task runs' states reach the database up to a second later; nothing in the run waits on
# them but the final check before Ray stops (reporting.py), which polls for them.
RECORDER_BATCH = {
    "PREFECT_SERVER_SERVICES_TASK_RUN_RECORDER_BATCH_SIZE": "100",
    "PREFECT_SERVER_SERVICES_TASK_RUN_RECORDER_FLUSH_INTERVAL": "1",
}
# where `flows` imports from: the server process imports its app from there (server_app.py)
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# Prefect's console handler level (its logging config, overridable per key from the environment)
CONSOLE_LEVEL_ENV = "PREFECT_LOGGING_HANDLERS_CONSOLE_LEVEL"


class ApiServerStart:
    """Use the configured API, or start a local one that Ray workers can reach.

    Prefect's in-process ephemeral API is invisible to other processes, so task runs on
    Ray workers would log nowhere; a subprocess server on loopback is shared by all. It is
    the server Prefect's own `SubprocessASGIServer` runs, launched here without importing
    Prefect's server package into this process (seconds of imports the flow never uses),
    and not waited for: `url` is known at once, so the caller can start Ray meanwhile, and
    `ready()` waits until the server answers.
    """

    def __init__(self) -> None:
        self.url: str = PREFECT_API_URL.value() or ""
        self.proc: subprocess.Popen | None = None
        if not self.url:
            # The server gets a socket already listening, not a port number to bind: it binds
            # seconds later, once its imports are done, and by then Ray (starting meanwhile)
            # may hold the port a free-port probe returned, as a listener or as the source
            # port of a connection (measured: "address already in use", the run lost).
            listener = socket.create_server(("127.0.0.1", 0), backlog=128)
            self.url = f"http://127.0.0.1:{listener.getsockname()[1]}/api"
            fd = listener.fileno()
            self.proc = subprocess.Popen(
                [
                    *(sys.executable, "-m", "uvicorn", "--app-dir", REPO_ROOT),
                    *("--factory", "flows.prefect_on_ray.server_app:create_app", "--fd", str(fd)),
                    *("--log-level", "error", "--lifespan", "on"),
                ],
                pass_fds=(fd,),
                # a flow process killed outright runs no atexit: the server must not outlive it
                # (SIGTERM: uvicorn shuts down cleanly, the database closed)
                preexec_fn=die_with_parent(signal.SIGTERM),
                env={
                    **os.environ,
                    # the local server has no network to report usage to; don't let it try
                    "PREFECT_SERVER_ANALYTICS_ENABLED": os.environ.get(
                        "PREFECT_SERVER_ANALYTICS_ENABLED", "false"
                    ),
                    "PREFECT_UI_ENABLED": "0",
                    **{k: os.environ.get(k, v) for k, v in RECORDER_BATCH.items()},
                    # how Prefect's own SubprocessASGIServer tells create_app what it is
                    # (private: tests/unit/test_prefect_seams.py)
                    "PREFECT__SERVER_EPHEMERAL": "1",
                    "PREFECT__SERVER_FINAL": "1",
                    **get_current_settings().to_environment_variables(exclude_unset=True),
                },
            )
            listener.close()  # the server holds its own copy
            atexit.register(self.stop)

    def wait(self, timeout_s: float = STARTUP_TIMEOUT_S) -> str:
        """The API URL once it answers; also set as PREFECT_API_URL for this process's children."""
        if self.proc is not None:
            proc = self.proc
            with httpx.Client() as client:

                def answers() -> bool:
                    if proc.poll() is not None:
                        raise RuntimeError(f"the Prefect API server exited with code {proc.returncode}")
                    return client.get(f"{self.url}/health", timeout=5).status_code == 200

                if not poll(answers, timeout_s):
                    raise RuntimeError(
                        f"the Prefect API server at {self.url} did not answer in {timeout_s:.0f} s"
                    )
            _lower_priority(self.proc.pid, SERVER_NICENESS)
        os.environ["PREFECT_API_URL"] = self.url
        return self.url

    @contextmanager
    def ready(self) -> Iterator[str]:
        """Wait for the server, then make it this process's Prefect API (Prefect read its
        settings at import, before the server existed)."""
        url = self.wait()
        with temporary_settings({PREFECT_API_URL: url}):
            yield url

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None


def _lower_priority(pid: int, niceness: int) -> None:
    """Run process `pid` at `niceness` (POSIX; a no-op elsewhere). Only ever lowered: raising
    a priority back needs privileges."""
    if hasattr(os, "setpriority") and os.getpriority(os.PRIO_PROCESS, pid) < niceness:
        os.setpriority(os.PRIO_PROCESS, pid, niceness)


_process_settings: list = []


def ensure_api_server() -> str:
    """The API URL, once a local server (if none is configured) answers; it becomes this
    process's Prefect API for good (the server stops when the process exits)."""
    api = ApiServerStart()
    url = api.wait()
    if api.proc is not None:
        settings = temporary_settings({PREFECT_API_URL: url})
        settings.__enter__()  # never left: for the process
        # kept referenced: a collected generator context manager runs its exit and resets them
        _process_settings.append(settings)
    return url


def worker_env(api_url: str | None = None) -> dict[str, str]:
    """Environment of the run's Ray workers: the flow run's API (so task runs report to it)
    and a fresh per-run engine API key (engines answer only clients that send it)."""
    url = api_url or PREFECT_API_URL.value() or os.environ.get("PREFECT_API_URL")
    if not url:
        from prefect.server.api.server import SubprocessASGIServer

        server = SubprocessASGIServer()
        url = server.api_url if server.running else None
    if not url:
        raise RuntimeError("no Prefect API URL: run through `python -m flows.train` or set PREFECT_API_URL")
    env = {
        "PREFECT_API_URL": url,
        # hex, never a leading '-' (a url-safe token starts with one 1 time in 64): SGLang
        # turns its config file's values into argv, and argparse reads such a value as a flag
        API_KEY_ENV: secrets.token_hex(24),
        # Ray copies every line a worker prints to the driver's terminal (a log monitor tails
        # the files, the driver prints them): a task run's INFO lines cost its worker, Ray and
        # the flow's process CPU (measured with trivial task runs: 28-30 -> 24 ms each, end to
        # end) and repeat what the UI shows. Warnings and errors still reach the terminal.
        CONSOLE_LEVEL_ENV: os.environ.get(CONSOLE_LEVEL_ENV, "WARNING"),
    }
    key = PREFECT_API_KEY.value()
    if key:
        env["PREFECT_API_KEY"] = key.get_secret_value() if hasattr(key, "get_secret_value") else str(key)
    return env
