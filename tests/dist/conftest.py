from pathlib import Path

import pytest

from infra.config import TinyModelConfig
from infra.model.tiny import build_tiny_model


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("tiny"), TinyModelConfig())
