"""load_tokenizer: the built-in model's tokenizer loads as AutoTokenizer loads it, without
torch; a directory naming another tokenizer class goes through AutoTokenizer."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest
from transformers import AutoTokenizer

from infra.config import TinyModelConfig
from infra.model.tiny import build_tiny_model
from infra.model.tokenizer import load_tokenizer, tokenizer_class


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> str:
    return str(build_tiny_model(tmp_path_factory.mktemp("tiny"), TinyModelConfig()))


def test_same_tokenizer_as_auto_tokenizer(model_dir):
    ours, auto = load_tokenizer(model_dir), AutoTokenizer.from_pretrained(model_dir)
    assert tokenizer_class(model_dir) == "TokenizersBackend"
    assert type(ours) is type(auto)
    for text in ["13+18=", "7:", "</s>", "a b\nc"]:
        assert ours(text)["input_ids"] == auto(text)["input_ids"]
        assert ours.decode(ours(text)["input_ids"]) == auto.decode(auto(text)["input_ids"])
    assert (ours.eos_token_id, ours.pad_token_id, ours.bos_token_id) == (
        auto.eos_token_id,
        auto.pad_token_id,
        auto.bos_token_id,
    )
    assert ours.get_vocab() == auto.get_vocab()


def test_loads_without_torch(model_dir):
    code = (
        "import sys\n"
        "from infra.model.tokenizer import load_tokenizer\n"
        f"tok = load_tokenizer({model_dir!r})\n"
        "print(len(tok.get_vocab()), 'torch' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    size, torch_loaded = out.stdout.split()
    assert int(size) > 10 and torch_loaded == "False"


def test_other_classes_go_through_auto_tokenizer(model_dir, tmp_path):
    other = tmp_path / "other"
    shutil.copytree(model_dir, other)
    config = json.loads((other / "tokenizer_config.json").read_text())
    (other / "tokenizer_config.json").write_text(json.dumps({**config, "tokenizer_class": "LlamaTokenizer"}))
    # a model-specific class: the generic one would load these files too, but differ from it
    loaded = load_tokenizer(str(other))
    assert type(loaded).__name__ == "LlamaTokenizer"
    assert type(loaded) is type(AutoTokenizer.from_pretrained(str(other)))


def test_a_broken_tokenizer_config_names_the_file(model_dir, tmp_path):
    broken = tmp_path / "broken"
    shutil.copytree(model_dir, broken)
    (broken / "tokenizer_config.json").write_text("[1, 2]")
    with pytest.raises(ValueError, match="tokenizer_config.json"):
        load_tokenizer(str(broken))
