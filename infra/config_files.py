"""Config files and `key.path=value` command-line overrides on top of RunConfig."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from infra.config import RunConfig


def apply_override(tree: dict[str, Any], override: str) -> None:
    """`algorithm.lr=1e-3` sets tree['algorithm']['lr']; the value is read as YAML."""
    key, sep, raw = override.partition("=")
    if not sep or not key.strip():
        raise ValueError(f"override {override!r} is not of the form key.path=value")
    parts = key.strip().split(".")
    node = tree
    for part in parts[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ValueError(f"override {override!r}: '{part}' is a value, not a section")
        node = child
    node[parts[-1]] = yaml.safe_load(raw) if raw.strip() else ""


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> RunConfig:
    """Defaults, then the file, then the overrides; pydantic names any bad field."""
    tree: dict[str, Any] = {}
    if path is not None:
        p = Path(path)
        if not p.is_file():
            raise FileNotFoundError(f"config file not found: {p}")
        loaded = yaml.safe_load(p.read_text()) or {}
        if not isinstance(loaded, dict):
            raise ValueError(f"config file {p}: top level must be a mapping, got {type(loaded).__name__}")
        tree = loaded
    for override in overrides or []:
        apply_override(tree, override)
    return RunConfig.model_validate(tree)
