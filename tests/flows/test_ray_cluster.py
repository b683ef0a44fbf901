"""Scale-out on an existing Ray cluster: two real `ray start` nodes on this machine (a head
with a `trainer_node` resource, a worker with an `engine_node` resource), and the training
CLI run from a directory that is not the repository with `cluster.ray_address` set.

The nodes are started without the repository on their path and in their own temporary
directory; the code reaches their workers only through the run's runtime_env
(`py_modules`), which the engine server's environment shows. Teardown stops exactly the
processes these `ray start` calls created (other Ray clusters may share the machine).
"""

from __future__ import annotations

import ast
import contextlib
import json
import os
import re
import secrets
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from infra.secrets import API_KEY_ENV
from tests.ports import free_port

pytestmark = [pytest.mark.flow, pytest.mark.cluster]
REPO = Path(__file__).resolve().parents[2]
RAY = str(Path(sys.executable).parent / "ray")


def _node_env(tmp: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH" and not k.startswith("RAY_")}
    # token auth, with this cluster's own token file (not the user's ~/.ray one)
    env.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN_PATH=f"{tmp}/token", RAY_USAGE_STATS_ENABLED="0")
    return env


def _ports(*flags: str) -> list[str]:
    # every port a node would otherwise take at its fixed default, which another cluster may hold
    return [arg for flag in flags for arg in (flag, str(free_port()))]


AGENT_PORTS = (
    "--dashboard-agent-listen-port",
    "--dashboard-agent-grpc-port",
    "--metrics-export-port",
    "--runtime-env-agent-port",
)


def _ray_start(args: list[str], env: dict[str, str], cwd: str) -> None:
    proc = subprocess.run(
        [RAY, "start", "--disable-usage-stats", "--node-ip-address", "127.0.0.1", "--num-gpus", "0", *args],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]


def _stop_our_nodes(tmp: str) -> None:
    """SIGTERM, then SIGKILL, every process of this cluster: those naming its temporary
    directory (GCS, raylets, agents, monitors) and all their descendants (workers)."""
    ours = [p for p in psutil.process_iter(["cmdline"]) if tmp in " ".join(p.info["cmdline"] or [])]
    procs = {p.pid: p for p in ours}
    for p in ours:
        with contextlib.suppress(psutil.NoSuchProcess):
            procs.update({c.pid: c for c in p.children(recursive=True)})
    for p in procs.values():
        with contextlib.suppress(psutil.NoSuchProcess):
            p.terminate()
    _, alive = psutil.wait_procs(list(procs.values()), timeout=10)
    for p in alive:
        with contextlib.suppress(psutil.NoSuchProcess):
            p.kill()
    psutil.wait_procs(alive, timeout=10)


@pytest.fixture(scope="module")
def two_nodes() -> Iterator[dict]:
    tmp = tempfile.mkdtemp(prefix="prl-ray-", dir="/tmp")  # short: Ray's socket paths live under it
    Path(tmp, "token").write_text(secrets.token_hex(32))
    env, port = _node_env(tmp), free_port()
    cwd = tempfile.mkdtemp(prefix="prl-node-")  # not the repository
    try:
        head = ["--head", "--port", str(port), "--temp-dir", tmp, "--include-dashboard", "false"]
        head += ["--num-cpus", "3", "--resources", json.dumps({"trainer_node": 4})]
        _ray_start(head + _ports("--ray-client-server-port", "--dashboard-port", *AGENT_PORTS), env, cwd)
        worker = ["--address", f"127.0.0.1:{port}", "--num-cpus", "2"]
        worker += ["--resources", json.dumps({"engine_node": 2})]
        _ray_start(worker + _ports(*AGENT_PORTS), env, cwd)
        yield {"address": f"127.0.0.1:{port}", "tmp": tmp, "env": env}
    finally:
        _stop_our_nodes(tmp)
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.rmtree(cwd, ignore_errors=True)


def files_holding(root: str | Path, secret: str) -> list[str]:
    """Files under `root` whose bytes contain `secret`."""
    needle = secret.encode()
    found = []
    for path in Path(root).rglob("*"):
        try:
            if path.is_file() and not path.is_symlink() and needle in path.read_bytes():
                found.append(str(path))
        except OSError:  # a socket, or a file removed meanwhile
            continue
    return found


def _node_ids(address: str, env: dict[str, str]) -> dict[str, str]:
    """Node id of the node holding each custom resource."""
    code = (
        "import json, ray\n"
        f"ray.init(address={address!r}, log_to_driver=False)\n"
        "print(json.dumps({k: n['NodeID'] for n in ray.nodes() if n['Alive'] for k in n['Resources']"
        " if k.endswith('_node')}))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120, check=True
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


class EngineEnvWatch(threading.Thread):
    """Records the PYTHONPATH of engine servers started by this cluster's workers."""

    def __init__(self, tmp: str):
        super().__init__(daemon=True)
        self.tmp, self.seen, self.done = tmp, set(), threading.Event()
        self.keys: set[str] = set()  # the run's engine key, as the engine servers got it

    def run(self) -> None:
        while not self.done.wait(0.5):
            for p in psutil.process_iter(["cmdline"]):
                if "infra.engine_server.server" not in " ".join(p.info["cmdline"] or []):
                    continue
                try:
                    env = p.environ()
                    path = env.get("PYTHONPATH", "")
                except psutil.Error:
                    continue
                if self.tmp in path:
                    self.seen.add(path.split(os.pathsep)[0])
                    if env.get(API_KEY_ENV):
                        self.keys.add(env[API_KEY_ENV])


def test_training_runs_across_two_ray_nodes(two_nodes, prefect_api, tmp_path):
    nodes = _node_ids(two_nodes["address"], two_nodes["env"])
    assert nodes["trainer_node"] != nodes["engine_node"]
    workdir = tmp_path / "elsewhere"
    workdir.mkdir()
    env = dict(two_nodes["env"])
    # the driver imports the project like an installed package; the nodes never see this path
    env.update(PYTHONPATH=str(REPO), PREFECT_API_URL=prefect_api)
    overrides = [
        f"cluster.ray_address={two_nodes['address']}",
        "cluster.trainer.resources.trainer_node=1",
        "cluster.engines.resources.engine_node=1",
        "num_rollout=3",
        "rollout.prompts_per_rollout=8",
        "rollout.n_samples_per_prompt=4",
        "eval.interval=2",
        "eval.num_prompts=4",
        "eval.n_samples=2",
        "eval.pass_k=[1,2]",
        "checkpoint.save_interval=2",
        f"storage.uri={tmp_path / 'runs'}",
        "run_name=two-nodes",
    ]
    watch = EngineEnvWatch(two_nodes["tmp"])
    watch.start()
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "flows.train", *overrides],
            cwd=workdir,
            env=env,
            capture_output=True,
            text=True,
            timeout=540,
        )
    finally:
        watch.done.set()
        watch.join()
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-6000:]
    for k in range(3):
        assert f"iter {k:04d} |" in out
    placement = ast.literal_eval(re.search(r"placement \(node ids\): (\{.*\})", out).group(1))
    assert placement["trainer"] == [nodes["trainer_node"]] * 2
    assert placement["engines"] == [nodes["engine_node"]]
    metrics = (tmp_path / "runs" / "two-nodes" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["rollout_id"] for line in metrics] == [0, 1, 2]
    # the engine server imported the project from the copy Ray unpacked on its node
    assert watch.seen and all("py_modules_files" in path for path in watch.seen), watch.seen
    # the key reached the other node's workers, and no file of either node holds it
    assert len(watch.keys) == 1
    assert files_holding(two_nodes["tmp"], watch.keys.pop()) == []
