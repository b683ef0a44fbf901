"""How the code reaches Ray workers: PYTHONPATH on a local cluster, py_modules on an existing one."""

from pathlib import Path

import flows
import infra
import tasks
from infra.cluster.ray_cluster import REPO_ROOT, runtime_env

REPO = str(Path(__file__).resolve().parents[2])


def test_local_cluster_shares_the_checkout():
    env = runtime_env("", {"PREFECT_API_URL": "http://127.0.0.1:1/api"})
    assert "py_modules" not in env
    assert env["env_vars"]["PYTHONPATH"].split(":")[0] == REPO_ROOT == REPO
    assert env["env_vars"]["PREFECT_API_URL"] == "http://127.0.0.1:1/api"


def test_existing_cluster_gets_the_packages_uploaded():
    env = runtime_env("10.0.0.1:6379", {"PREFECT_API_URL": "http://10.0.0.2:4200/api"})
    assert env["py_modules"] == [infra, flows, tasks]
    # no path of this machine leaks to the nodes
    assert "PYTHONPATH" not in env["env_vars"]
    assert env["env_vars"] == {"PREFECT_API_URL": "http://10.0.0.2:4200/api"}
