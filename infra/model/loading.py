"""Model directories: the built-in tiny model stored with the run, localizing any HF model
directory (local or s3://) so `from_pretrained` can read it, and copying a PEFT adapter
directory to the machine that loads it."""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import shutil
import tempfile
from pathlib import Path

from infra.config import RESOLVED_SEEDS, ModelConfig, TinyModelConfig
from infra.storage.fs import download_dir, filesystem, is_local, upload_dir, uri_exists

BUILTIN_TINY = "builtin:tiny-llama"
_COMPLETE = ".complete"
ADAPTER_CONFIG = "adapter_config.json"  # marks a PEFT adapter directory


def _cache_root(given: str | None) -> Path:
    return Path(given or os.environ.get("PRL_CACHE_DIR", Path.home() / ".cache" / "prefect-rl"))


def base_model_uri(model: ModelConfig, run_uri: str, storage_options: dict) -> str:
    """The HF directory the run starts from; the tiny model is copied into the run folder
    on first use, from this machine's cache (built there once, see `tiny_model_dir`)."""
    if model.path != BUILTIN_TINY:
        if model.path.startswith("builtin:"):
            raise ValueError(f"model.path: unknown built-in model {model.path!r} (known: {BUILTIN_TINY})")
        return model.path
    uri = f"{run_uri.rstrip('/')}/base_model"
    if uri_exists(f"{uri}/config.json", storage_options):
        return uri
    # config.json goes last: it marks the run's copy complete
    upload_dir(str(tiny_model_dir(model.tiny)), uri, storage_options)
    return uri


def tiny_model_dir(cfg: TinyModelConfig, cache_root: str | None = None) -> Path:
    """The built-in tiny model for `cfg`, built once per machine into the cache.

    Building imports torch and transformers' model code into the flow's process, which
    needs neither otherwise (seconds of CPU at every start, beside the engines' and
    trainers'). The build is a pure function of the shape, the seed and the torch and
    transformers versions (seeded init) and of the builder's code (`BUILD_VERSION`), so those
    name the cached copy.
    """
    from infra.model.tiny import BUILD_VERSION, build_tiny_model  # torch only once it builds

    root = _cache_root(cache_root)
    versions = {pkg: importlib.metadata.version(pkg) for pkg in ("torch", "transformers")}
    key = json.dumps(
        [cfg.model_dump(mode="json", context=RESOLVED_SEEDS), versions, BUILD_VERSION], sort_keys=True
    )
    local = root / "tiny" / hashlib.sha1(key.encode()).hexdigest()[:16]
    if (local / "config.json").exists():  # renamed into place whole: complete
        return local

    local.parent.mkdir(parents=True, exist_ok=True)
    tmp = tempfile.mkdtemp(dir=local.parent, prefix=".build-")
    try:
        build_tiny_model(tmp, cfg)
        os.rename(tmp, local)
    except OSError:
        if not (local / "config.json").exists():  # not just a run beside us that built it first
            raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return local


def localize(uri: str, storage_options: dict, cache_root: str | None = None) -> str:
    """A local directory holding the model at `uri` (downloaded once per machine if remote)."""
    if not uri_exists(f"{uri.rstrip('/')}/config.json", storage_options):
        raise FileNotFoundError(f"model.path: no HF model directory (config.json) at {uri}")
    if is_local(uri):
        return filesystem(uri, storage_options)[1]
    root = _cache_root(cache_root)
    local = root / "models" / hashlib.sha1(uri.encode()).hexdigest()[:16]
    if not (local / _COMPLETE).exists():
        local.mkdir(parents=True, exist_ok=True)
        download_dir(uri.rstrip("/"), str(local), storage_options)
        (local / _COMPLETE).touch()
    return str(local)


def copy_adapter(uri: str, storage_options: dict, local_dir: str) -> str:
    """A copy of the PEFT adapter directory at `uri` (local or s3://) in `local_dir`; its path."""
    if not uri_exists(f"{uri.rstrip('/')}/{ADAPTER_CONFIG}", storage_options):
        raise FileNotFoundError(f"no PEFT adapter directory ({ADAPTER_CONFIG}) at {uri}")
    os.makedirs(local_dir, exist_ok=True)
    download_dir(uri.rstrip("/"), local_dir, storage_options)
    return local_dir
