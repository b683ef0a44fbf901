"""A deployment loads the flow from its file by path, as a top-level module (`train`) that
no Ray worker can import: the flow in the flow run context must still reach the workers."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import ray.cloudpickle
from prefect.flows import load_flow_from_entrypoint

from flows.prefect_on_ray.context_cache import _flow_module_by_value

REPO = Path(__file__).resolve().parents[2]

# a worker: the repository on its path (as the run's workers have it), another folder as cwd
LOAD = "import sys, ray.cloudpickle as c; print(c.loads(sys.stdin.buffer.read())['flow'].name)"


def _load_elsewhere(data: bytes, tmp_path: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", LOAD],
        input=data,
        capture_output=True,
        cwd=tmp_path,
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
        timeout=120,
    )


def test_a_flow_loaded_by_path_unpickles_on_a_worker(tmp_path, monkeypatch):
    monkeypatch.chdir(REPO)
    flow = load_flow_from_entrypoint("flows/train.py:train")
    module = sys.modules[flow.fn.__module__]
    assert module.__name__ == "train"  # how Prefect names it: the premise of the fix
    try:
        by_reference = _load_elsewhere(ray.cloudpickle.dumps({"flow": flow}), tmp_path)
        assert by_reference.returncode != 0 and b"No module named 'train'" in by_reference.stderr
        _flow_module_by_value(flow)
        by_value = _load_elsewhere(ray.cloudpickle.dumps({"flow": flow}), tmp_path)
        assert by_value.returncode == 0, by_value.stderr.decode()[-2000:]
        assert by_value.stdout.decode().strip() == "train"
    finally:
        ray.cloudpickle.unregister_pickle_by_value(module)
        sys.modules.pop("train", None)
