"""The conformance tier: our side runs here, SGLang's own code in .venv-sglang subprocesses."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SGLANG_PYTHON = REPO / ".venv-sglang" / "bin" / "python"
SIDE = Path(__file__).resolve().parent / "sglang_side"
SGLANG_VERSION = "0.5.23"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if Path(str(item.fspath)).is_relative_to(Path(__file__).parent):
            item.add_marker(pytest.mark.sglang)


@pytest.fixture(scope="session")
def sglang_python() -> str:
    """The conformance venv's python; missing, the tier fails (in CI) or is skipped (by hand)."""
    if not SGLANG_PYTHON.exists():
        message = f"{SGLANG_PYTHON} is missing: build the conformance venv with `make sglang-venv`"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return str(SGLANG_PYTHON)


def sglang_env() -> dict:
    # one thread each: the 2 cores are shared with the test process and the other ranks
    return dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore", SGLANG_LOG_LEVEL="error")


def spawn(python: str, script: str, *args: str) -> subprocess.Popen:
    return subprocess.Popen(
        [python, str(SIDE / script), *args],
        env=sglang_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def run_json(python: str, script: str, payload: object, timeout_s: float = 180) -> object:
    """Run an SGLang-side script with `payload` on stdin; it answers one JSON document on stdout."""
    done = subprocess.run(
        [python, str(SIDE / script)],
        input=json.dumps(payload),
        env=sglang_env(),
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )
    assert done.returncode == 0, f"{script} failed:\n{done.stderr[-6000:]}"
    return json.loads(done.stdout.strip().splitlines()[-1])
