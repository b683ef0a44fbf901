"""Size and boundary rules a newcomer can rely on, checked on every run.

- `flows/train.py` reads like the algorithm: at most 120 lines.
- The README is for users: at most 250 lines; reference pages live in docs/.
- No function over 60 lines outside tests/.
- Prefect's private modules are used only inside the Prefect-on-Ray package, the one place
  whose contract tests (tests/unit/test_prefect_seams.py) name each private assumption;
  tests may probe them.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SOURCE_DIRS = ("flows", "tasks", "infra", "bench")
PREFECT_ON_RAY = REPO / "flows" / "prefect_on_ray"
MAX_FUNCTION_LINES = 60


def _sources() -> list[Path]:
    return sorted(p for d in SOURCE_DIRS for p in (REPO / d).rglob("*.py"))


def test_the_flow_module_is_short() -> None:
    lines = len((REPO / "flows" / "train.py").read_text().splitlines())
    assert lines <= 120, f"flows/train.py has {lines} lines (at most 120: the loop, nothing else)"


def test_the_readme_is_short() -> None:
    lines = len((REPO / "README.md").read_text().splitlines())
    assert lines <= 250, f"README.md has {lines} lines (at most 250; reference goes to docs/)"


def test_no_function_is_over_60_lines() -> None:
    long = []
    for path in _sources():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                n = node.end_lineno - node.lineno + 1
                if n > MAX_FUNCTION_LINES:
                    long.append(f"{path.relative_to(REPO)}:{node.lineno} {node.name} ({n} lines)")
    assert not long, "functions over 60 lines:\n" + "\n".join(long)


PRIVATE = re.compile(r"^\s*(from|import)\s+prefect(_ray)?\._|prefect\._internal", re.M)


def test_prefect_internals_stay_in_one_package() -> None:
    outside = [
        str(p.relative_to(REPO))
        for p in _sources()
        if PRIVATE.search(p.read_text()) and PREFECT_ON_RAY not in p.parents
    ]
    assert not outside, (
        f"Prefect's private modules used outside {PREFECT_ON_RAY.relative_to(REPO)}: {outside}"
    )
