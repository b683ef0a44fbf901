"""Model directories: the built-in tiny model stored with the run, and localizing any HF
model directory (local or s3://) so `from_pretrained` can read it."""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path

from infra.config import ModelConfig
from infra.storage.fs import download_dir, filesystem, is_local, upload_dir, uri_exists

BUILTIN_TINY = "builtin:tiny-llama"
_COMPLETE = ".complete"


def base_model_uri(model: ModelConfig, run_uri: str, storage_options: dict) -> str:
    """The HF directory the run starts from; builds the tiny model on first use."""
    if model.path != BUILTIN_TINY:
        if model.path.startswith("builtin:"):
            raise ValueError(f"model.path: unknown built-in model {model.path!r} (known: {BUILTIN_TINY})")
        return model.path
    uri = f"{run_uri.rstrip('/')}/base_model"
    if uri_exists(f"{uri}/config.json", storage_options):
        return uri
    from infra.model.tiny import build_tiny_model

    with tempfile.TemporaryDirectory() as tmp:
        build_tiny_model(tmp, model.tiny)
        upload_dir(tmp, uri, storage_options)  # config.json last: it marks the directory complete
    return uri


def localize(uri: str, storage_options: dict, cache_root: str | None = None) -> str:
    """A local directory holding the model at `uri` (downloaded once per machine if remote)."""
    if not uri_exists(f"{uri.rstrip('/')}/config.json", storage_options):
        raise FileNotFoundError(f"model.path: no HF model directory (config.json) at {uri}")
    if is_local(uri):
        return filesystem(uri, storage_options)[1]
    root = Path(cache_root or os.environ.get("PRL_CACHE_DIR", Path.home() / ".cache" / "prefect-rl"))
    local = root / "models" / hashlib.sha1(uri.encode()).hexdigest()[:16]
    if not (local / _COMPLETE).exists():
        local.mkdir(parents=True, exist_ok=True)
        download_dir(uri.rstrip("/"), str(local), storage_options)
        (local / _COMPLETE).touch()
    return str(local)
