"""Render the config reference (docs/CONFIG.md) from the pydantic field descriptions,
so the documentation cannot drift from the code: `python -m infra.config_docs`."""

from __future__ import annotations

import json
import sys

from pydantic import BaseModel

from infra.config import RunConfig


def _rows(defaults: BaseModel, prefix: str = "") -> list[str]:
    """One row per field. Defaults are read from a default-built instance, not from the
    section classes: a parent may build a section with other values than the class's own
    (`cluster.trainer` is `RoleResources(num_workers=2)`). Values are shown as the config
    dumps them: a seed derived from the run's `seed` is empty there."""
    rows = []
    dumped = defaults.model_dump(mode="json")
    for name, field in type(defaults).model_fields.items():
        value = getattr(defaults, name)
        if isinstance(value, BaseModel):
            rows.append(f"| **`{prefix}{name}`** | section | {field.description} |")
            rows.extend(_rows(value, f"{prefix}{name}."))
        else:
            shown = None if dumped[name] is None else _plain(value)
            rows.append(f"| `{prefix}{name}` | `{json.dumps(shown)}` | {field.description} |")
    return rows


def _plain(value: object) -> object:
    return list(value) if isinstance(value, tuple) else value


def render() -> str:
    head = [
        "# Config reference",
        "",
        "Generated from `infra/config.py` by `python -m infra.config_docs > docs/CONFIG.md`.",
        "Set fields in a YAML file (`--config`) or as `key.path=value` overrides.",
        "",
        "| field | default | meaning |",
        "|---|---|---|",
    ]
    return "\n".join(head + _rows(RunConfig())) + "\n"


if __name__ == "__main__":
    sys.stdout.write(render())
