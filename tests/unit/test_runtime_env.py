"""How the code reaches Ray workers: PYTHONPATH on a local cluster, py_modules on an existing one."""

import os
from pathlib import Path

import flows
import infra
import tasks
from infra.cluster.ray_cluster import REPO_ROOT, runtime_env
from infra.secrets import API_KEY_ENV, SECRET_ENV

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


def test_secrets_travel_by_the_setup_hook_not_env_vars(monkeypatch):
    env = {"PREFECT_API_URL": "http://127.0.0.1:1/api", API_KEY_ENV: "k1", "PREFECT_API_KEY": "k2"}
    for address in ("", "10.0.0.1:6379"):
        renv = runtime_env(address, env)
        assert set(SECRET_ENV) & set(renv["env_vars"]) == set()
        assert "k1" not in str(renv["env_vars"]) and "k2" not in str(renv["env_vars"])
        for name in (API_KEY_ENV, "PREFECT_API_KEY"):
            # set first, so teardown restores the variable's absence after the hook sets it
            # (a delenv of a missing variable records nothing to undo)
            monkeypatch.setenv(name, "")
            monkeypatch.delenv(name)
        renv["worker_process_setup_hook"]()  # what Ray runs in each worker as it starts
        assert (os.environ[API_KEY_ENV], os.environ["PREFECT_API_KEY"]) == ("k1", "k2")
    assert "worker_process_setup_hook" not in runtime_env("", {"PREFECT_API_URL": "u"})
