"""As a person would: a Prefect server, the work pool, `prefect deploy`, a worker, a
deployment run of tiny-demo, then headless Chromium on the flow-run page.

Screenshots go to docs/ (the README shows them). Needs Debian's chromium
(/usr/bin/chromium; `make test` installs it) and the `playwright` package (no browser download:
Playwright drives the system Chromium through its executable path)."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.ports import free_port

pytestmark = pytest.mark.ui

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
PREFECT = [sys.executable, "-m", "prefect"]
RUN_TIMEOUT_S = 360


class Stack:
    """Processes started for the test, stopped (process groups) at the end."""

    def __init__(self, tmp: Path, port: int) -> None:
        self.tmp, self.port = tmp, port
        self.url = f"http://127.0.0.1:{port}"
        self.procs: list[subprocess.Popen] = []
        keep = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
        self.env = {
            **keep,
            "PREFECT_HOME": str(tmp / "prefect-home"),
            "PREFECT_API_URL": f"{self.url}/api",
            "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
            "PREFECT_CLI_PROMPT": "false",
            "PREFECT_SERVER_API_HOST": "127.0.0.1",
            "PREFECT_SERVER_API_PORT": str(port),
        }

    def start(self, name: str, *args: str) -> subprocess.Popen:
        log = open(self.tmp / f"{name}.log", "wb")  # noqa: SIM115 - closed with the process
        proc = subprocess.Popen(
            [*PREFECT, *args],
            cwd=ROOT,
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.procs.append(proc)
        return proc

    def cli(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        done = subprocess.run(
            [*PREFECT, *args], cwd=ROOT, env=self.env, capture_output=True, text=True, timeout=180
        )
        if check and done.returncode != 0:
            raise AssertionError(f"prefect {' '.join(args)} failed:\n{done.stdout}\n{done.stderr}")
        return done

    def api(self, method: str, path: str, **kw) -> dict | list:
        r = httpx.request(method, f"{self.url}/api{path}", timeout=30, **kw)
        r.raise_for_status()
        return r.json()

    def stop(self, proc: subprocess.Popen) -> None:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()

    def log(self, name: str) -> str:
        path = self.tmp / f"{name}.log"
        return path.read_text(errors="replace")[-4000:] if path.exists() else ""


@pytest.fixture
def stack(tmp_path):
    stack = Stack(tmp_path, free_port())
    server = stack.start("server", "server", "start", "--host", "127.0.0.1", "--port", str(stack.port))
    deadline = time.monotonic() + 90
    while True:
        try:
            if httpx.get(f"{stack.url}/api/health", timeout=2).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        if server.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"prefect server did not come up:\n{stack.log('server')}")
        time.sleep(0.5)
    try:
        yield stack
    finally:
        for proc in reversed(stack.procs):
            stack.stop(proc)


def _wait_for_final_state(stack: Stack, flow_run_id: str) -> dict:
    deadline = time.monotonic() + RUN_TIMEOUT_S
    while time.monotonic() < deadline:
        run = stack.api("GET", f"/flow_runs/{flow_run_id}")
        if run["state"]["type"] in {"COMPLETED", "FAILED", "CRASHED", "CANCELLED"}:
            return run
        time.sleep(2)
    raise AssertionError(f"flow run not finished after {RUN_TIMEOUT_S}s:\n{stack.log('worker')}")


def test_deploy_run_and_watch_in_the_browser(stack, tmp_path):
    from playwright.sync_api import expect, sync_playwright

    assert shutil.which(CHROMIUM) or Path(CHROMIUM).exists(), f"{CHROMIUM} missing: apt-get install chromium"
    stack.cli("work-pool", "create", "cpu-pool", "--type", "process")
    stack.cli("deploy", "--name", "tiny-demo", "--no-prompt")
    stack.start("worker", "worker", "start", "--pool", "cpu-pool")

    # a bad parameter is refused by name before any run starts (the deployment enforces the schema)
    bad = stack.cli(
        "deployment",
        "run",
        "train/tiny-demo",
        "--params",
        json.dumps({"config": {"algorithm": {"lr": -1}}}),
        check=False,
    )
    assert bad.returncode != 0 and "lr" in bad.stdout + bad.stderr, bad.stdout + bad.stderr

    config = {
        "run_name": "ui-demo",
        "num_rollout": 2,
        "rollout": {"prompts_per_rollout": 16, "n_samples_per_prompt": 4},
        "storage": {"uri": str(tmp_path / "runs")},
        "eval": {"interval": 2, "num_prompts": 4, "n_samples": 2, "pass_k": [1, 2]},
    }
    out = stack.cli("deployment", "run", "train/tiny-demo", "--params", json.dumps({"config": config})).stdout
    flow_run_id = re.search(r"UUID:\s*([0-9a-f-]{36})", out).group(1)
    run = _wait_for_final_state(stack, flow_run_id)
    assert run["state"]["type"] == "COMPLETED", f"{run['state']}\n{stack.log('worker')}"
    stack.stop(stack.procs[-1])  # the worker: nothing else may run (nightly is deployed next)

    # the nightly deployment, for its page in the README
    stack.cli("deploy", "--name", "nightly", "--no-prompt")
    (nightly,) = stack.api(
        "POST", "/deployments/filter", json={"deployments": {"name": {"any_": ["nightly"]}}}
    )
    assert nightly["concurrency_options"]["collision_strategy"] == "ENQUEUE"
    (schedule,) = nightly["schedules"]
    assert (schedule["schedule"]["cron"], schedule["schedule"]["timezone"]) == ("0 2 * * *", "UTC")
    (pull,) = nightly["pull_steps"]  # the repository's absolute path, taken at deploy time
    assert pull["prefect.deployments.steps.set_working_directory"]["directory"] == str(ROOT)

    DOCS.mkdir(exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch_persistent_context(
            user_data_dir=str(tmp_path / "chromium-profile"),
            executable_path=CHROMIUM,
            headless=True,
            args=[
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-quic",
                "--no-first-run",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
            ],
            viewport={"width": 1440, "height": 1000},
        )
        page = browser.new_page()
        page.set_default_timeout(60_000)
        page.goto(f"{stack.url}/runs/flow-run/{flow_run_id}")
        page.get_by_text("Task Runs", exact=True).click()  # the run page's tabs
        expect(page.get_by_text("train-0000").first).to_be_visible()
        expect(page.get_by_text("generate-0001").first).to_be_visible()
        page.screenshot(path=str(DOCS / "ui-flow-run.png"), full_page=True)

        page.get_by_text("Artifacts", exact=True).click()
        expect(page.get_by_text("ui-demo-metrics").first).to_be_visible()
        page.screenshot(path=str(DOCS / "ui-artifacts.png"), full_page=True)

        page.goto(f"{stack.url}/deployments/deployment/{nightly['id']}")
        expect(page.get_by_text("cpu-pool").first).to_be_visible()  # loaded, not a placeholder
        expect(page.get_by_text(re.compile("At 0?2:00 AM every day")).first).to_be_visible()
        page.wait_for_load_state("networkidle")
        page.wait_for_timeout(1500)  # the page fades in
        page.screenshot(path=str(DOCS / "ui-nightly.png"))
        browser.close()
