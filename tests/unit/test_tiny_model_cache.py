"""The built-in tiny model is built once per machine (infra.model.loading.tiny_model_dir)
and copied into each run folder; a start with a warm cache imports no torch."""

from __future__ import annotations

import filecmp
import os
import subprocess
import sys

import torch
from safetensors.torch import load_file

from infra.config import ModelConfig, RunConfig, TinyModelConfig
from infra.model.loading import base_model_uri, tiny_model_dir
from infra.model.tiny import build_tiny_model


def test_the_cached_model_is_the_built_one_and_is_built_once(tmp_path):
    cfg = TinyModelConfig()
    cached = tiny_model_dir(cfg, str(tmp_path / "cache"))
    fresh = build_tiny_model(tmp_path / "fresh", cfg)
    a, b = load_file(str(cached / "model.safetensors")), load_file(str(fresh / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert filecmp.cmp(cached / "config.json", fresh / "config.json", shallow=False)
    assert filecmp.cmp(cached / "tokenizer.json", fresh / "tokenizer.json", shallow=False)
    stamp = os.stat(cached / "model.safetensors").st_mtime_ns
    assert tiny_model_dir(cfg, str(tmp_path / "cache")) == cached
    assert os.stat(cached / "model.safetensors").st_mtime_ns == stamp  # not built again
    other = tiny_model_dir(TinyModelConfig(seed=3), str(tmp_path / "cache"))
    assert other != cached
    # a seed derived from the run's `seed` names its cached model as the same seed set explicitly
    assert tiny_model_dir(RunConfig(seed=3).model.tiny, str(tmp_path / "cache")) == other
    assert tiny_model_dir(RunConfig().model.tiny, str(tmp_path / "cache")) == cached
    assert not torch.equal(load_file(str(other / "model.safetensors"))[next(iter(a))], a[next(iter(a))])
    # nothing half-built is left beside the cached models
    assert sorted(p.name for p in (tmp_path / "cache" / "tiny").iterdir()) == sorted(
        [cached.name, other.name]
    )


def test_a_run_folder_gets_the_cached_model_without_torch(tmp_path):
    cache = str(tmp_path / "cache")
    tiny_model_dir(TinyModelConfig(), cache)  # warm
    code = (
        "import sys\n"
        "from infra.config import ModelConfig\n"
        "from infra.model.loading import base_model_uri\n"
        f"print(base_model_uri(ModelConfig(), {str(tmp_path / 'run')!r}, {{}}), 'torch' in sys.modules)\n"
    )
    env = {**os.environ, "PRL_CACHE_DIR": cache}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env)
    uri, torch_loaded = out.stdout.split()
    assert torch_loaded == "False"
    assert sorted(os.listdir(uri)) == sorted(os.listdir(tiny_model_dir(TinyModelConfig(), cache)))
    # a second call finds the run's copy
    assert base_model_uri(ModelConfig(), str(tmp_path / "run"), {}) == uri
