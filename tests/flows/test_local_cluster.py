"""A local run beside other Ray clusters, and what its secrets leave behind; its own
cluster refuses a driver without the run's Ray token.

Each test gives Ray a temporary folder of its own (RAY_TMPDIR): the other cluster's
current-cluster file lives there, and so do the sessions of every cluster started, whose
files must not hold the run's engine key.
"""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import psutil
import pytest

from infra.secrets import API_KEY_ENV
from tests.flows.test_ray_cluster import AGENT_PORTS, RAY, _ports, _stop_our_nodes, files_holding

pytestmark = pytest.mark.flow
REPO = Path(__file__).resolve().parents[2]

# In a child process: a local connect with a secret, a worker that reads it, the GCS it got.
PROBE = textwrap.dedent(
    """
    from infra.cluster.cluster_token import require_cluster_token
    assert require_cluster_token()  # as flows.train does, before Ray is imported
    import os, sys, ray
    from infra.cluster.placement import plan_placement
    from infra.cluster.ray_cluster import connect
    from infra.config import ClusterConfig

    key = sys.argv[1]
    assert connect("", plan_placement(ClusterConfig()), None, {"PRL_ENGINE_API_KEY": key})
    seen = ray.get(ray.remote(lambda: os.environ.get("PRL_ENGINE_API_KEY")).remote())
    print("worker-key", seen == key)
    gcs = ray.get_runtime_context().gcs_address
    print("gcs", gcs)
    print("token", os.environ["RAY_AUTH_TOKEN"])
    # a driver without the cluster's token, as anyone else on the machine or the network
    import subprocess
    stranger = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH")}
    joined = subprocess.run(
        [sys.executable, "-c", f"import ray; ray.init(address={gcs!r}); print('JOINED')"],
        env=stranger, capture_output=True, text=True, timeout=120,
    )
    print("stranger-joined", joined.returncode == 0 or "JOINED" in joined.stdout)
    ray.shutdown()
    """
)


@pytest.fixture
def ray_tmp() -> Iterator[str]:
    # short: Ray's socket paths live under it
    tmp = tempfile.mkdtemp(prefix="prl-", dir="/tmp")
    try:
        yield tmp
    finally:
        _stop_our_nodes(tmp)
        shutil.rmtree(tmp, ignore_errors=True)


def _env(ray_tmp: str, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "PREFECT_API_URL"))}
    env.update(RAY_TMPDIR=ray_tmp, RAY_USAGE_STATS_ENABLED="0", PYTHONPATH=str(REPO), **extra)
    return env


def test_local_connect_starts_its_own_cluster_beside_a_live_one(ray_tmp):
    env = _env(ray_tmp)
    started = subprocess.run(
        [RAY, "start", "--head", "--port=0", "--num-cpus=1", "--include-dashboard=false"]
        + ["--disable-usage-stats", *_ports("--ray-client-server-port", *AGENT_PORTS)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert started.returncode == 0, started.stdout[-2000:] + started.stderr[-2000:]
    other = Path(ray_tmp, "ray", "ray_current_cluster").read_text().strip()
    key = f"sentinel-{secrets.token_hex(8)}"
    # the other cluster is both the last `ray start` and RAY_ADDRESS: neither may be joined
    probe = subprocess.run(
        [sys.executable, "-c", PROBE, key],
        env={**env, "RAY_ADDRESS": other},
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert probe.returncode == 0, probe.stdout[-3000:] + probe.stderr[-3000:]
    lines = dict(line.split(" ", 1) for line in probe.stdout.splitlines() if " " in line)
    assert lines["worker-key"] == "True"
    assert lines["gcs"] and lines["gcs"] != other
    assert files_holding(ray_tmp, key) == []
    # Ray's listeners take every interface; the cluster's token keeps strangers out, and
    # no file holds it either
    assert lines["stranger-joined"] == "False"
    assert len(lines["token"]) == 64 and files_holding(ray_tmp, lines["token"]) == []


class EngineKeyWatch(threading.Thread):
    """The run's engine key, read from an engine server's environment, and what the server
    answers a generate request without it and with it."""

    def __init__(self, ray_tmp: str):
        super().__init__(daemon=True)
        self.ray_tmp, self.key, self.status, self.done = ray_tmp, None, {}, threading.Event()
        self.ray_auth: tuple[str | None, str | None] = (None, None)

    def run(self) -> None:
        while not self.done.wait(0.3) and not self.status:
            for p in psutil.process_iter(["cmdline"]):
                cmd = p.info["cmdline"] or []
                if "infra.engine_server.server" not in " ".join(cmd):
                    continue
                try:
                    env = p.environ()
                except psutil.Error:
                    continue
                if env.get("RAY_TMPDIR") != self.ray_tmp or not env.get(API_KEY_ENV):
                    continue
                self.key = env[API_KEY_ENV]
                self.ray_auth = (env.get("RAY_AUTH_MODE"), env.get("RAY_AUTH_TOKEN"))
                try:  # the server binds a port of its own choosing
                    ports = [c.laddr.port for c in p.net_connections("tcp") if c.status == psutil.CONN_LISTEN]
                    if ports:
                        self.probe(f"http://{cmd[cmd.index('--host') + 1]}:{ports[0]}")
                except (psutil.Error, httpx.HTTPError):
                    continue  # gone, or not answering yet

    def probe(self, url: str) -> None:
        body = {"input_ids": [[5, 6, 7]], "sampling_params": {"max_new_tokens": 1}}
        for name, headers in (("none", {}), ("run key", {"Authorization": f"Bearer {self.key}"})):
            self.status[name] = httpx.post(
                f"{url}/generate", json=body, headers=headers, timeout=60
            ).status_code


def test_flow_runs_beside_a_stale_cluster_and_leaves_its_key_nowhere(ray_tmp, tmp_path):
    # a cluster that is gone: its current-cluster file and RAY_ADDRESS both still name it
    stale = "127.0.0.1:1"
    Path(ray_tmp, "ray").mkdir()
    Path(ray_tmp, "ray", "ray_current_cluster").write_text(stale)
    env = _env(ray_tmp, RAY_ADDRESS=stale, PREFECT_HOME=str(tmp_path / "prefect"))
    watch = EngineKeyWatch(ray_tmp)
    watch.start()
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "flows.train", "num_rollout=2", "checkpoint.resume=fresh"]
            + [f"storage.uri={tmp_path / 'runs'}", "run_name=beside"],
            env=env,
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=300,
        )
    finally:
        watch.done.set()
        watch.join()
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-6000:]
    assert "iter 0001 |" in out
    sessions = [p for p in Path(ray_tmp, "ray").glob("session_2*") if p.is_dir()]
    assert len(sessions) == 1  # the run's own cluster, in the folder it was given
    # the engine enforced the run's key, which the test read from the engine's environment
    assert watch.key and watch.status == {"none": 401, "run key": 200}, watch.status
    assert where_found(watch.key, out, ray_tmp, tmp_path) == []
    # the run's Ray cluster demanded a token of its own (inherited by the engine's process),
    # which is written nowhere either
    mode, token = watch.ray_auth
    assert mode == "token" and token and len(token) == 64
    assert where_found(token, out, ray_tmp, tmp_path) == []


def where_found(key: str, out: str, *roots: str | Path) -> list[str]:
    """Where the key was found: the run's output, Ray's session, the run folder, Prefect's home."""
    found = ["output"] if key in out else []
    for root in roots:
        found += files_holding(root, key)
    return found
