"""The Prefect API server a run starts for itself (flows/prefect_on_ray/api_server.py)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import httpx
import psutil
import pytest

from infra.retry import poll

REPO = Path(__file__).resolve().parents[2]

pytestmark = [
    pytest.mark.flow,
    pytest.mark.skipif(not hasattr(os, "getpriority"), reason="process priorities are POSIX"),
]

# In a child process: a clean Prefect environment (no API configured, its own database).
PROBE = textwrap.dedent(
    """
    import gc, os, psutil
    from prefect.settings import PREFECT_API_URL
    from flows.prefect_on_ray import ensure_api_server
    from flows.prefect_on_ray.api_server import SERVER_NICENESS

    url = ensure_api_server()
    gc.collect()  # what dropped the settings before: a collected context manager's exit
    servers = [p for p in psutil.Process().children() if "uvicorn" in " ".join(p.cmdline())]
    print("url", url == PREFECT_API_URL.value(), PREFECT_API_URL.value())
    print("servers", len(servers))
    print("niceness", [os.getpriority(os.PRIO_PROCESS, p.pid) for p in servers], SERVER_NICENESS)
    env = servers[0].environ()
    print("recorder", env["PREFECT_SERVER_SERVICES_TASK_RUN_RECORDER_BATCH_SIZE"],
          env["PREFECT_SERVER_SERVICES_TASK_RUN_RECORDER_FLUSH_INTERVAL"])
    """
)


def _run_probe(code: str, prefect_home) -> dict[str, str]:
    """Run `code` in a child process with a clean Prefect environment; its printed
    `key value` lines."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env.update(PREFECT_HOME=str(prefect_home), PREFECT_SERVER_ANALYTICS_ENABLED="false")
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return dict(line.split(" ", 1) for line in out.stdout.splitlines() if " " in line)


def test_the_started_server_stays_the_api_and_runs_below_ray_workers(tmp_path):
    lines = _run_probe(PROBE, tmp_path)
    # the process's Prefect API is the server it started, also after a garbage collection
    assert lines["url"].startswith("True http://127.0.0.1:"), lines["url"]
    assert lines["servers"] == "1"
    # Ray runs its workers (trainer ranks, engines, task runs) at niceness 15: the server is below
    assert lines["niceness"] == "[19] 19"
    # its task run recorder writes states in batches, at most a second apart
    assert lines["recorder"] == "100 1"


# The port is the server's from the moment its URL is known: Ray starts while the server
# imports, and a port merely probed free could be taken in between.
PORT_PROBE = textwrap.dedent(
    """
    import errno, socket, urllib.parse
    from flows.prefect_on_ray import ApiServerStart

    api = ApiServerStart()
    port = urllib.parse.urlparse(api.url).port
    try:
        socket.create_server(("127.0.0.1", port)).close()
        print("bind", "free")
    except OSError as e:
        print("bind", "in-use" if e.errno == errno.EADDRINUSE else e)
    print("answers", api.wait() == api.url)
    api.stop()
    """
)


def test_the_servers_port_is_held_before_it_answers(tmp_path):
    assert _run_probe(PORT_PROBE, tmp_path) == {"bind": "in-use", "answers": "True"}


def _api_server(parent: psutil.Process) -> psutil.Process | None:
    for child in parent.children():
        if "uvicorn" in " ".join(child.cmdline()):
            return child
    return None


def test_the_server_dies_with_a_killed_flow_process(tmp_path):
    # the CLI starts its own server (no API configured); SIGKILL runs none of its cleanup
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "RAY_ADDRESS"))}
    env.update(PREFECT_HOME=str(tmp_path / "prefect"), PREFECT_SERVER_ANALYTICS_ENABLED="false")
    args = ["num_rollout=1", "checkpoint.resume=fresh", f"storage.uri={tmp_path / 'runs'}"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "flows.train", *args],
        cwd=REPO,
        env=env,
        start_new_session=True,  # its Ray processes too, for the cleanup below
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        flow_process = psutil.Process(proc.pid)
        server = None

        def serving() -> bool:  # up and answering, as during a run
            nonlocal server
            server = server or _api_server(flow_process)
            if server is None:
                return False
            ports = [c.laddr.port for c in server.net_connections("tcp") if c.status == psutil.CONN_LISTEN]
            try:
                return bool(ports) and httpx.get(f"http://127.0.0.1:{ports[0]}/api/health").status_code == 200
            except httpx.HTTPError:
                return False

        assert poll(serving, 120), "the API server never answered"
        proc.kill()
        proc.wait()
        gone, _ = psutil.wait_procs([server], timeout=10)
        assert gone == [server], "the API server outlived the flow process"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # whatever else the run had started
        proc.wait()
