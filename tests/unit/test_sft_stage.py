"""The SFT stage's record in the run folder: done only with the same SFT settings, never
after a half-written model, kept by RL's `resume=fresh`, and the RL config it hands on."""

from __future__ import annotations

import pytest

from infra.config import RunConfig
from infra.sft_stage import begin_sft, check_pipeline, export_uri, finished_sft, mark_finished, rl_config
from infra.storage.fs import RunStore
from infra.storage.run_folder import clear_for_fresh_start


def _cfg(tmp_path, **sections) -> RunConfig:
    return RunConfig(run_name="stage", storage={"uri": str(tmp_path)}, **sections)


def test_a_stage_is_done_only_with_the_settings_that_shape_sft(tmp_path):
    cfg = _cfg(tmp_path, sft={"epochs": 2})
    assert finished_sft(cfg) is None
    done = mark_finished(cfg, {"loss": 0.5})
    assert done["hf_export_uri"] == export_uri(cfg) == str(tmp_path / "stage" / "sft" / "hf")
    assert finished_sft(cfg) == done
    # RL's settings and the eval's do not touch what SFT trained
    assert finished_sft(_cfg(tmp_path, sft={"epochs": 2}, algorithm={"lr": 1e-4}, num_rollout=3)) == done
    for other in (
        {"sft": {"epochs": 3}},
        {"sft": {"epochs": 2}, "seed": 1},  # the model's and SFT's seeds derive from it
        {"sft": {"epochs": 2}, "model": {"tiny": {"seed": 1}}},
        {"sft": {"epochs": 2}, "data": {"train_path": "builtin:addition"}},
    ):
        assert finished_sft(_cfg(tmp_path, **other)) is None, other
    begin_sft(cfg)  # a new stage starts: the old record goes before any weight is written
    assert finished_sft(cfg) is None


def test_fresh_rl_keeps_the_sft_stage_and_rl_starts_from_its_model(tmp_path):
    cfg = _cfg(tmp_path)
    mark_finished(cfg, {})
    store = RunStore(cfg.storage, cfg.run_name)
    store.write_text("metrics.jsonl", "{}\n")
    store.write_text("sft/hf/config.json", "{}")
    assert clear_for_fresh_start(store) == ["metrics.jsonl"]
    assert store.ls() == ["sft"] and finished_sft(cfg) is not None
    rl = rl_config(cfg, export_uri(cfg))
    assert rl.model.path == export_uri(cfg) and cfg.model.path == "builtin:tiny-llama"
    assert rl.model_dump(exclude={"model"}) == cfg.model_dump(exclude={"model"})


def test_the_pipeline_refuses_a_lora_run_before_any_stage(tmp_path):
    check_pipeline(_cfg(tmp_path))
    with pytest.raises(ValueError, match="model.lora: the pipeline's last stage"):
        check_pipeline(_cfg(tmp_path, model={"lora": {}}))


def test_the_sft_seed_derives_from_the_run_seed_unless_set():
    assert RunConfig().sft.seed == 0
    assert RunConfig(seed=7).sft.seed == 7
    assert RunConfig(seed=7, sft={"seed": 3}).sft.seed == 3
    assert RunConfig.model_validate({**RunConfig(seed=7).model_dump(mode="json"), "seed": 8}).sft.seed == 8
