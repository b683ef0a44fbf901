"""The gpu-grpo recipe's data and reward path on CPU: GSM8K rows in the dataset's own
format, the recipe's chat template, system prompt, length limit and grader, with the tiny
model (given a chat template, as instruct models ship one) behind a real engine server.
Only what needs GPUs is swapped: the engine kind, the model and the cluster."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
from transformers import AutoTokenizer

from infra.config import TinyModelConfig
from infra.config_files import load_config
from infra.data.graders import gsm8k
from infra.model.tiny import build_tiny_model
from infra.preflight import preflight
from infra.rollout.manager import RolloutManager
from tests.engine_server import running_engine

ROOT = Path(__file__).resolve().parents[2]
TEMPLATE = (
    "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}</{{ m['role'] }}>{% endfor %}"
    "{% if add_generation_prompt %}<assistant>{% endif %}"
)
# GSM8K's published train rows: question, and a worked answer ending in "#### N"
ROWS = [
    {
        "question": "Natalia sold clips to 48 of her friends in April, and then she sold half as many "
        "clips in May. How many clips did Natalia sell altogether in April and May?",
        "answer": "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\nNatalia sold 48+24 = <<48+24=72>>72 "
        "clips altogether in April and May.\n#### 72",
    },
    {
        "question": "Weng earns $12 an hour for babysitting. Yesterday, she just did 50 minutes of "
        "babysitting. How much did she earn?",
        "answer": "Weng earns 12/60 = $<<12/60=0.2>>0.2 per minute.\nWorking 50 minutes, she earned "
        "0.2 x 50 = $<<0.2*50=10>>10.\n#### 10",
    },
    {"question": "x" * 900, "answer": "A question too long for the recipe's max_prompt_len.\n#### 1"},
]


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("recipe")
    model = build_tiny_model(root / "model", TinyModelConfig(max_position_embeddings=2048))
    tok = AutoTokenizer.from_pretrained(model)
    tok.chat_template = TEMPLATE
    tok.save_pretrained(model)
    for split in ("train", "test"):
        pd.DataFrame(ROWS).to_parquet(root / f"{split}.parquet")
    recipe = load_config(
        str(ROOT / "configs" / "gpu-grpo.yaml"),
        [
            "rollout.engine=torch",
            f"model.path={model}",
            f"data.train_path={root / 'train.parquet'}",
            f"data.eval_path={root / 'test.parquet'}",
            f"storage.uri={root / 'runs'}",
            "rollout.prompts_per_rollout=3",
            "rollout.sampling.max_new_tokens=8",
            "algorithm.global_batch_size=null",
            "cluster.trainer.gpus_per_worker=0",
            "cluster.trainer.num_workers=1",
            "cluster.engines.gpus_per_worker=0",
        ],
    )
    with running_engine(model) as url:
        yield recipe, str(model), url


def test_recipe_passes_preflight_and_rolls_out_templated_gsm8k(setup) -> None:
    recipe, model, url = setup
    assert recipe.data.reward == "gsm8k" and recipe.data.apply_chat_template
    preflight(recipe)  # data columns, reward, tokenizer, lengths, storage
    m = RolloutManager(recipe, [url], model)
    summary = m.generate(0)
    samples = m.get_batch(0).samples
    assert summary["prompts_dropped"] == 1  # the 900-character question is over 512 tokens
    assert len(samples) == 2 * recipe.rollout.n_samples_per_prompt
    for s in samples:
        assert s.prompt.startswith(f"<system>{recipe.data.system_prompt}</system><user>")
        assert s.prompt.endswith("</user><assistant>")
        assert s.status in ("completed", "truncated"), s.error  # the grader read every raw label
        assert s.label.rstrip().endswith(("#### 72", "#### 10"))
    # the grader scores the real format: a completion with the right final number is correct
    (natalia,) = {s.label for s in samples if "#### 72" in s.label}
    assert gsm8k("", "48 in April, 24 in May: 72 in all. #### 72", natalia) == 1.0
    assert gsm8k("", "She sold 48 clips. #### 48", natalia) == 0.0
