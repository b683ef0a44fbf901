"""infra/ is layered: a subsystem imports only from the layers below it, and never Prefect.

Lowest first. A layer may import itself and anything listed before it; a module's
function-level imports count too (Ray imports an actor's module wherever its handle goes,
and a lazy import is still a dependency).
"""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

LAYERS: list[set[str]] = [
    # the config tree and what every part may use
    {"config", "config_docs", "config_files", "errors", "retry", "lifetime", "heap", "startup", "secrets"},
    {"cluster", "model", "storage", "tracking", "algorithms"},
    {"data"},
    # engine lifecycle (launch, actor, fleet) and the HTTP client every caller shares
    {"engines"},
    # both halves of weight sync: the trainer's sender, the engines' receiver, transports, check
    {"weights"},
    {"engine_server"},
    {"rollout"},
    {"trainer"},
    # the loop's rules and the parts that wire everything together
    {"schedule", "preflight", "system", "handles", "sft_stage", "stage_handles", "stage_systems"},
]


def _layer_of(part: str) -> int:
    for i, names in enumerate(LAYERS):
        if part in names:
            return i
    raise AssertionError(f"infra/{part} is in no layer of {__name__}.LAYERS: add it where it belongs")


def _infra_imports(path: Path) -> set[str]:
    """The infra parts (first name below infra) that a module imports, and any non-infra roots."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        else:
            continue
        for name in names:
            parts = name.split(".")
            if parts[0] == "infra" and len(parts) > 1:
                found.add(parts[1])
            elif parts[0] in ("prefect", "prefect_ray", "flows", "tasks"):
                found.add("!" + parts[0])
    return found


def _part(path: Path) -> str:
    rel = path.relative_to(REPO / "infra")
    return rel.parts[0] if len(rel.parts) > 1 else rel.stem


def test_infra_imports_only_lower_layers_and_never_prefect() -> None:
    wrong = []
    for path in sorted((REPO / "infra").rglob("*.py")):
        if path.name == "__init__.py" and path.parent == REPO / "infra":
            continue
        own = _layer_of(_part(path))
        for dep in sorted(_infra_imports(path)):
            if dep.startswith("!"):
                wrong.append(
                    f"{path.relative_to(REPO)} imports {dep[1:]} (infra never imports Prefect or the flows)"
                )
            elif dep != _part(path) and _layer_of(dep) > own:
                wrong.append(f"{path.relative_to(REPO)} imports infra.{dep}, a higher layer")
    assert not wrong, "\n".join(wrong)
