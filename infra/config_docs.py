"""Render the config reference (docs/CONFIG.md) from the pydantic field descriptions,
so the documentation cannot drift from the code: `python -m infra.config_docs`."""

from __future__ import annotations

import json
import sys

from pydantic import BaseModel

from infra.config import RunConfig


def _default(field) -> str:
    value = field.default_factory() if field.default_factory is not None else field.default
    if isinstance(value, BaseModel):
        return "(section)"
    return f"`{json.dumps(value)}`"


def _rows(model: type[BaseModel], prefix: str = "") -> list[str]:
    rows = []
    for name, field in model.model_fields.items():
        ann = field.annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            rows.append(f"| **`{prefix}{name}`** | section | {field.description} |")
            rows.extend(_rows(ann, f"{prefix}{name}."))
        else:
            rows.append(f"| `{prefix}{name}` | {_default(field)} | {field.description} |")
    return rows


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
    return "\n".join(head + _rows(RunConfig)) + "\n"


if __name__ == "__main__":
    sys.stdout.write(render())
