"""Preflight: every check that can run before Ray starts fails with the field or file
named, writes nothing, and `checkpoint.resume` decides what happens to a used run folder."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from infra.config import RunConfig
from infra.config_files import load_config
from infra.data.builtin_tasks import builtin_rows
from infra.handles import RunHandles
from infra.preflight import PreflightError, preflight
from infra.storage.checkpoints import CheckpointStore, config_hash
from infra.storage.fs import RunStore
from infra.storage.metrics import append_metrics, read_metrics
from tests.config_tree import set_paths

HERE = Path(__file__).resolve().parent


def cfg(tmp_path: Path, **tree) -> RunConfig:
    base = {"storage": {"uri": str(tmp_path / "runs")}, "run_name": "r"}
    set_paths(base, tree)
    return RunConfig.model_validate(base)


def files_under(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*")) if root.exists() else []


def fails(config: RunConfig, match: str, root: Path) -> None:
    before = files_under(root)
    with pytest.raises(PreflightError, match=match):
        preflight(config)
    assert files_under(root) == before, "a failed preflight wrote to storage"


def jsonl(path: Path, rows: list, raw: str = "") -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows) + raw)
    return str(path)


def test_defaults_pass_and_write_nothing(tmp_path):
    result = preflight(cfg(tmp_path))
    assert result.finished is None and result.cleared == []
    assert files_under(tmp_path) == []
    # the schedule's epoch ends count the same rows the rollout manager draws from
    assert result.num_train_prompts == len(builtin_rows("digit-copy", "train"))


def test_data_errors_name_the_field_and_file(tmp_path):
    good = [{"prompt": "1:", "label": "1"}] * 3
    cases = {
        "missing": (str(tmp_path / "nope.jsonl"), r"data.train_path: .*nope.jsonl"),
        "empty": (jsonl(tmp_path / "empty.jsonl", []), r"data.train_path: no rows in .*empty.jsonl"),
        "column": (
            jsonl(tmp_path / "col.jsonl", [{"question": "1:", "label": "1"}]),
            r"data.train_path: column 'prompt' missing in .*col.jsonl",
        ),
        # line 3 is the bad one (line 2 is blank): the error must say 3, not 1
        "json": (
            jsonl(tmp_path / "bad.jsonl", good[:1], raw='\n{"prompt": "2:", \n'),
            r"data.train_path: .*bad.jsonl line 3: invalid JSON",
        ),
        "format": (str(tmp_path / "x.csv"), r"data.train_path: .*x.csv"),
    }
    (tmp_path / "x.csv").write_text("prompt,label\n1:,1\n")
    for path, match in cases.values():
        fails(cfg(tmp_path, data__train_path=path), match, tmp_path / "runs")
    fails(cfg(tmp_path, data__eval_path=cases["empty"][0]), r"data.eval_path: no rows", tmp_path / "runs")


def test_unreadable_data_file(tmp_path):
    if os.geteuid() == 0:
        pytest.skip("root reads everything")
    path = jsonl(tmp_path / "locked.jsonl", [{"prompt": "1:", "label": "1"}])
    os.chmod(path, 0)
    fails(cfg(tmp_path, data__train_path=path), r"data.train_path: .*locked.jsonl", tmp_path / "runs")


def test_reward_plugins(tmp_path, monkeypatch):
    fails(cfg(tmp_path, data__reward="no_such_module_xyz:f"), r"data.reward: .*no_such_module_xyz", tmp_path)
    fails(cfg(tmp_path, data__reward="tests.unit.test_rewards:nope"), r"data.reward: .*nope", tmp_path)
    plugin = tmp_path / "plugin_dir" / "my_reward.py"
    plugin.parent.mkdir()
    plugin.write_text("def score(prompt, response, label, **kw):\n    return 1.0\n")
    # a file path works from anywhere (loaded by path on every worker)
    preflight(cfg(tmp_path, data__reward=f"{plugin}:score"))
    fails(cfg(tmp_path, data__reward=f"{plugin}:missing"), r"data.reward: .*missing", tmp_path / "runs")
    (tmp_path / "broken.py").write_text("def score(:\n")
    fails(cfg(tmp_path, data__reward=f"{tmp_path / 'broken.py'}:score"), r"SyntaxError", tmp_path / "runs")
    # a module found only through the current directory would not import on the workers
    monkeypatch.chdir(plugin.parent)
    monkeypatch.syspath_prepend(str(plugin.parent))
    monkeypatch.delenv("PYTHONPATH", raising=False)
    import sys

    monkeypatch.setattr(sys, "path", [p for p in sys.path if p != str(plugin.parent)] + [""])
    fails(cfg(tmp_path, data__reward="my_reward:score"), r"Ray workers would not find it", tmp_path / "runs")
    monkeypatch.setenv("PYTHONPATH", str(plugin.parent))
    preflight(cfg(tmp_path, data__reward="my_reward:score"))


def test_lengths_fit_the_model_positions(tmp_path):
    long = jsonl(
        tmp_path / "long.jsonl", [{"prompt": "1:", "label": "1"}, {"prompt": "7" * 201, "label": "7"}]
    )
    fails(
        cfg(
            tmp_path,
            data__train_path=long,
            data__eval_path="builtin:digit-copy",
            rollout__prompts_per_rollout=2,
        ),
        r"data.train_path: row 1 has a prompt of 201 tokens.*64 positions",
        tmp_path / "runs",
    )
    fails(
        cfg(tmp_path, rollout__sampling__max_new_tokens=100),
        r"rollout.sampling.max_new_tokens=100 .*64 positions",
        tmp_path / "runs",
    )
    fails(cfg(tmp_path, rollout__sampling__stop=["ab"]), r"rollout.sampling.stop: 'ab' is 2 tokens", tmp_path)


def test_empty_prompts_are_refused_naming_the_row(tmp_path):
    for i, empty in enumerate(["", "   ", "\n", []]):
        path = jsonl(
            tmp_path / f"e{i}.jsonl", [{"prompt": "1:", "label": "1"}, {"prompt": empty, "label": "1"}]
        )
        fails(
            cfg(tmp_path, data__train_path=path, rollout__prompts_per_rollout=1),
            rf"data.train_path: column 'prompt' holds an empty prompt in .*e{i}.jsonl \(row 1\)",
            tmp_path / "runs",
        )


def test_a_batch_larger_than_the_data_is_refused(tmp_path):
    path = jsonl(tmp_path / "three.jsonl", [{"prompt": f"{i}:", "label": str(i)} for i in range(3)])
    fails(
        cfg(tmp_path, data__train_path=path, data__eval_path=path, rollout__prompts_per_rollout=4),
        r"rollout.prompts_per_rollout=4 exceeds the 3 prompts of data.train_path \(.*three.jsonl\)",
        tmp_path / "runs",
    )
    over = {"rollout__prompts_per_rollout": 2, "rollout__over_sample_prompts": 2}
    fails(  # over-sampled prompts are drawn from the data too
        cfg(tmp_path, data__train_path=path, data__eval_path=path, **over),
        r"rollout.prompts_per_rollout=2 \+ rollout.over_sample_prompts=2 exceeds the 3 prompts",
        tmp_path / "runs",
    )
    assert (
        preflight(
            cfg(tmp_path, data__train_path=path, data__eval_path=path, rollout__prompts_per_rollout=3)
        ).num_train_prompts
        == 3
    )
    # no data.eval_path: one of the three rows is held out for evaluation, and the count says so
    fails(
        cfg(tmp_path, data__train_path=path, rollout__prompts_per_rollout=3),
        r"exceeds the 2 prompts of data.train_path \(.*three.jsonl; 1 more held out for evaluation",
        tmp_path / "runs",
    )
    assert (
        preflight(cfg(tmp_path, data__train_path=path, rollout__prompts_per_rollout=2)).num_train_prompts == 2
    )


@pytest.mark.parametrize(
    ("prompt", "named"),
    [
        ("caf\u00e9 1:", "'\u00e9' (U+00E9)"),
        ("1:\t2", "'\\t' (U+0009)"),
        ("\u4e2d\u6587", "'\u4e2d' (U+4E2D), '\u6587' (U+6587)"),
        ("\U0001f600", "U+1F600"),
    ],
)
def test_characters_the_char_tokenizer_lacks_are_named(tmp_path, prompt, named):
    rows = [{"prompt": "1:", "label": "1"}, {"prompt": prompt, "label": "1"}]
    path = jsonl(tmp_path / "u.jsonl", rows)
    with pytest.raises(PreflightError) as err:
        preflight(cfg(tmp_path, data__train_path=path, rollout__prompts_per_rollout=1))
    assert str(err.value).startswith("data.train_path: row 1: the model's tokenizer has no token for ")
    assert named in str(err.value)
    with pytest.raises(PreflightError, match=r"data.system_prompt: .*U\+00E9"):
        preflight(cfg(tmp_path, data__system_prompt="r\u00e9sum\u00e9"))


def test_model_directory_must_load(tmp_path):
    fails(cfg(tmp_path, model__path=str(tmp_path / "none")), r"model.path: .*config.json", tmp_path / "runs")
    broken = tmp_path / "broken_model"
    broken.mkdir()
    (broken / "config.json").write_text("{}")
    fails(cfg(tmp_path, model__path=str(broken)), r"model.path: .*does not load", tmp_path / "runs")
    fails(cfg(tmp_path, model__path="builtin:huge"), r"model.path: unknown built-in", tmp_path)


def test_storage_must_be_writable(tmp_path):
    if os.geteuid() == 0:
        pytest.skip("root writes everywhere")
    locked = tmp_path / "locked"
    locked.mkdir()
    os.chmod(locked, 0o500)
    try:
        fails(cfg(tmp_path, storage__uri=str(locked / "runs")), r"storage.uri: cannot write", tmp_path)
    finally:
        os.chmod(locked, 0o700)


def used_folder(tmp_path: Path, num_rollout: int = 3) -> RunStore:
    """What a finished 3-iteration run leaves: metrics rows and a committed checkpoint."""
    config = cfg(tmp_path, num_rollout=num_rollout)
    store = RunStore(config.storage, config.run_name)
    for k in range(3):
        append_metrics(store, {"rollout_id": k})
    store.write_text("rollouts/0000002.parquet", "x")
    ckpts = CheckpointStore(store, keep_last=None)
    ckpts.begin(2)
    ckpts.commit(2, {"next_rollout_id": 3, "config_hash": config_hash(config), "run_id": "earlier"})
    return store


def test_never_refuses_a_used_folder_and_names_the_ways_out(tmp_path):
    store = used_folder(tmp_path)
    message = r"checkpoint.resume=never: the run folder .*runs/r already holds outputs.*metrics.jsonl.*"
    message += r"checkpoint.resume=auto.*checkpoint.resume=fresh.*run_name"
    fails(cfg(tmp_path), message, tmp_path)
    assert len(read_metrics(store)) == 3


def test_fresh_deletes_old_outputs_only_after_all_checks_pass(tmp_path):
    store = used_folder(tmp_path)
    fails(cfg(tmp_path, checkpoint__resume="fresh", data__reward="nope_xyz:f"), "data.reward", tmp_path)
    result = preflight(cfg(tmp_path, checkpoint__resume="fresh"))
    assert set(result.cleared) >= {"metrics.jsonl", "checkpoints", "rollouts"}
    assert store.ls() == [] and read_metrics(store) == []


def test_a_finished_run_says_so(tmp_path):
    used_folder(tmp_path)
    result = preflight(cfg(tmp_path, num_rollout=3, checkpoint__resume="auto"))
    assert (
        result.finished and "already finished" in result.finished and "3 of num_rollout=3" in result.finished
    )
    assert preflight(cfg(tmp_path, num_rollout=5, checkpoint__resume="auto")).finished is None
    fails(
        cfg(tmp_path, num_rollout=5, checkpoint__resume="auto", algorithm__lr=0.5),
        r"checkpoint.resume: .*another model/data/rollout/algorithm",
        tmp_path,
    )


def test_restore_truncates_metrics_even_without_a_checkpoint(tmp_path):
    config = cfg(tmp_path, checkpoint__resume="auto")
    store = RunStore(config.storage, config.run_name)
    for k in range(3):  # a run that stopped before its first save
        append_metrics(store, {"rollout_id": k})
    handles = RunHandles(
        config, manager=None, trainers=[], run_uri=store.run_uri, model_uri="", transport=None
    )
    assert handles.restore() == 0
    assert read_metrics(store) == []


def test_resume_spec_is_validated():
    for good in ("never", "fresh", "auto", "s3://b/run/checkpoints/iter_0000001", "/abs/iter_1"):
        RunConfig.model_validate({"checkpoint": {"resume": good}})
    with pytest.raises(ValueError, match="checkpoint.resume: 'sometimes'"):
        RunConfig.model_validate({"checkpoint": {"resume": "sometimes"}})


def test_oversubscribed_local_cluster_is_reported(tmp_path):
    many = os.cpu_count() + 1
    result = preflight(cfg(tmp_path, cluster__engines__num_workers=many))
    assert any(f"{many} engines" in w and "cores" in w for w in result.warnings), result.warnings
    assert (
        preflight(cfg(tmp_path, cluster__ray_address="auto")).warnings == []
    )  # a real cluster: its business


def test_the_default_cluster_fits_two_cores_and_oversubscription_is_reported(monkeypatch):
    from infra.preflight import oversubscription

    def warned(cores: int, *overrides: str) -> list[str]:
        monkeypatch.setattr(os, "cpu_count", lambda: cores)
        return oversubscription(load_config(None, list(overrides)))

    # the README's machine: 2 trainer ranks + 1 single-threaded engine sharing 2 cores
    assert warned(2) == [] and warned(2, "mode=sync") == []
    assert "2 trainer ranks x threads_per_worker=1 train together and want 2 cores" in warned(1)[0]
    (critic,) = warned(2, "algorithm.advantage_estimator=ppo", "critic.enabled=true")
    assert "2 critic ranks" in critic and "want 4 cores" in critic
    assert warned(4, "algorithm.advantage_estimator=ppo", "critic.enabled=true") == []
    (engines,) = warned(2, "cluster.engines.num_workers=3")
    assert "3 engines" in engines and "want 3 cores" in engines
    # multi-threaded processes must not share cores while generating and training at once
    (omp,) = warned(4, "cluster.threads_per_worker=2")
    assert "want 6 cores" in omp
    assert warned(4, "cluster.threads_per_worker=2", "mode=sync") == []
    assert warned(6, "cluster.threads_per_worker=2") == []


def test_an_sglang_engine_needs_an_interpreter_that_finds_sglang(tmp_path):
    missing = cfg(tmp_path, rollout__engine="sglang", rollout__sglang_python=str(tmp_path / "no-python"))
    with pytest.raises(PreflightError, match="rollout.sglang_python: cannot run"):
        preflight(missing)
    # this interpreter runs, but has no SGLang (it lives in its own venv)
    without = cfg(tmp_path, rollout__engine="sglang", rollout__sglang_python=sys.executable)
    with pytest.raises(PreflightError, match="cannot import sglang.*make sglang-venv"):
        preflight(without)
