"""The SFT stage's place in the run folder, whether it is done, and the RL config that starts
from its model.

    <run>/sft/hf/         the fine-tuned model, an HF directory (config.json written last)
    <run>/sft/DONE.json   written after it: the stage's fingerprint, its metrics, the model's URI

The stage is done when DONE.json holds the fingerprint of the current config: the settings
that decide what SFT trains (the model, the `sft` section, the data fields that shape a
prompt). Any other change, an RL setting say, keeps a finished stage; one of these runs it
again, over the old one.
"""

from __future__ import annotations

import hashlib
import json

from infra.config import RESOLVED_SEEDS, RunConfig
from infra.storage.fs import RunStore
from infra.storage.run_folder import SFT_DIR

DONE = f"{SFT_DIR}/DONE.json"
# the data fields that change the examples SFT trains on
_DATA_FIELDS = {
    "train_path",
    "prompt_key",
    "apply_chat_template",
    "system_prompt",
    "max_prompt_len",
    "overlong_prompt",
}


def fingerprint(cfg: RunConfig) -> str:
    # the seeds as the stage trains with them, also those derived from the run's `seed`
    identity = {
        "model": cfg.model.model_dump(mode="json", context=RESOLVED_SEEDS),
        "sft": cfg.sft.model_dump(mode="json", context=RESOLVED_SEEDS),
        "data": cfg.data.model_dump(mode="json", include=_DATA_FIELDS),
    }
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:16]


def _store(cfg: RunConfig) -> RunStore:
    return RunStore(cfg.storage, cfg.run_name)


def export_uri(cfg: RunConfig) -> str:
    """Where the stage writes its model: the `model.path` of the RL that follows."""
    return _store(cfg).uri(SFT_DIR, "hf")


def finished_sft(cfg: RunConfig) -> dict | None:
    """The finished stage's record (metrics, `hf_export_uri`), or None when it must run."""
    store = _store(cfg)
    if not store.exists(DONE):
        return None
    done = json.loads(store.read_text(DONE))
    return done if done.get("fingerprint") == fingerprint(cfg) else None


def begin_sft(cfg: RunConfig) -> None:
    """Before training: no record of an earlier stage may outlive a half-written model."""
    _store(cfg).delete(DONE)


def mark_finished(cfg: RunConfig, metrics: dict) -> dict:
    """After the model is written: record the stage as done; returns the record."""
    done = {"fingerprint": fingerprint(cfg), "hf_export_uri": export_uri(cfg), "metrics": metrics}
    _store(cfg).write_text(DONE, json.dumps(done, indent=1))
    return done


def check_pipeline(cfg: RunConfig) -> None:
    """What the pipeline cannot run, refused before any stage starts."""
    if cfg.model.lora is not None:
        raise ValueError(
            "model.lora: the pipeline's last stage evaluates the RL run's HF export, which with a LoRA "
            "adapter is a PEFT adapter directory the eval engines do not load; run the pipeline "
            "without model.lora, or flows.train from the SFT stage's model"
        )


def rl_config(cfg: RunConfig, model_uri: str) -> RunConfig:
    """`cfg` with RL starting from `model_uri` (an HF directory, as model.path)."""
    return cfg.model_copy(update={"model": cfg.model.model_copy(update={"path": model_uri})})
