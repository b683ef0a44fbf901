"""`--dist loadgroup` runs every flow test on one xdist worker and spreads the rest: the
contract of tests/worker_groups.py with xdist (its scheduler hook and the `_split_scope`
override), checked on a throwaway tree of tests that record the worker they ran on."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.worker_groups import BESIDE, FlowsOnOneWorker

REPO = Path(__file__).resolve().parents[2]
TEST = """
import os, time

def _ran(name):
    time.sleep(0.3)  # long enough that both workers ask for work
    with open(os.path.join({out!r}, name), "w") as f:
        f.write(os.environ["PYTEST_XDIST_WORKER"])
"""


def _tree(root: Path, out: Path) -> None:
    for folder, count in (("flows", 6), ("unit", 6)):
        (root / "tests" / folder).mkdir(parents=True)
        body = TEST.format(out=str(out)) + "".join(
            f"\ndef test_{i}():\n    _ran('{folder}-{i}')\n" for i in range(count)
        )
        (root / "tests" / folder / f"test_{folder}.py").write_text(body)


def test_flow_tests_share_one_worker_and_the_rest_spread(tmp_path):
    root, out = tmp_path / "tree", tmp_path / "out"
    out.mkdir()
    _tree(root, out)
    env = dict(os.environ, PYTHONPATH=str(REPO))
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "tests.worker_groups"]
    cmd += ["-n", "2", "--dist", "loadgroup", "--rootdir", str(root), "-c", os.devnull, str(root / "tests")]
    done = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    ran = {p.name: p.read_text() for p in out.iterdir()}
    assert len(ran) == 12, sorted(ran)
    flows = {worker for name, worker in ran.items() if name.startswith("flows-")}
    others = {worker for name, worker in ran.items() if name.startswith("unit-")}
    assert len(flows) == 1, ran
    assert others - flows, ran  # the other worker ran the rest meanwhile


def test_the_flow_tests_named_beside_are_units_of_their_own():
    split = FlowsOnOneWorker._split_scope  # reads no state of the scheduler
    beside = f"{BESIDE[0]}::test_a[grpo]"
    assert split(None, beside) == beside
    assert split(None, "tests/flows/test_resume.py::test_b") == "tests/flows/"
    assert split(None, "tests/unit/test_x.py::test_c") == "tests/unit/test_x.py::test_c"
