"""The rollout manager without Ray: two real engine servers, prompts, rewards, advantages,
parquet output, determinism and per-sample reward failures."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from infra.config import RunConfig, TinyModelConfig
from infra.engines.launch import launch_engine, stop_engine, wait_until_healthy
from infra.model.tiny import build_tiny_model
from infra.rollout.manager import KEEP_SUMMARIES, RolloutManager
from infra.rollout.rollout_files import read_rollout_with_stats, write_rollout
from infra.rollout.scoring import TooManyFailedSamples
from infra.storage.fs import RunStore
from tests.ports import free_port


def flaky_reward(prompt: str, response: str, label: str, **kw) -> float:
    if int(prompt[0]) % 2 == 0:
        raise RuntimeError("grader crashed")
    return float(response.strip() == label)


@pytest.fixture(scope="module")
def engines(tmp_path_factory):
    model = build_tiny_model(tmp_path_factory.mktemp("model"), TinyModelConfig())
    procs, urls = [], []
    try:
        for i in range(2):
            port = free_port()
            procs.append(launch_engine("torch", str(model), "127.0.0.1", port, seed=i, threads=1))
            urls.append(f"http://127.0.0.1:{port}")
        for url, proc in zip(urls, procs, strict=True):
            wait_until_healthy(url, proc, 180)  # a loaded CI machine starts servers slowly
        yield str(model), urls
    finally:
        for proc in procs:
            stop_engine(proc)


def config(tmp_path, **over) -> RunConfig:
    tree = {
        "rollout": {"prompts_per_rollout": 6, "n_samples_per_prompt": 4, "sampling": {"max_new_tokens": 3}},
        "storage": {"uri": str(tmp_path)},
        # failures stay per sample here (test_rewards checks that a mostly failed rollout stops)
        "data": {"reward": f"{__name__}:flaky_reward", "max_failed_fraction": 1.0},
        "eval": {"num_prompts": 5, "n_samples": 4, "pass_k": [1, 4]},
        "cluster": {"engines": {"num_workers": 2}},
    }
    tree.update(over)
    return RunConfig.model_validate(tree)


def manager(engines, tmp_path, **over) -> RolloutManager:
    model, urls = engines
    return RolloutManager(config(tmp_path, **over), urls, model)


def test_generate_scores_groups_and_writes_parquet(engines, tmp_path):
    m = manager(engines, tmp_path)
    summary = m.generate(0)
    batch = m.get_batch(0)
    assert summary["num_samples"] == len(batch) == 24
    groups = [s.group for s in batch.samples]
    assert groups == sorted(groups) and set(groups) == set(range(6))  # both engines' halves, in order
    for s in batch.samples:
        assert len(s.response_ids) == len(s.engine_logprobs) >= 1
        assert s.weight_version == 0
    # a raising reward fails only its own samples, with reward 0, and is counted
    failed = [s for s in batch.samples if s.status == "failed"]
    assert failed and all(
        int(s.prompt[0]) % 2 == 0 and s.reward == 0.0 and "grader" in s.error for s in failed
    )
    assert summary["reward_failures"] == len(failed)
    # GRPO: advantages are centred within each prompt group
    for g in range(6):
        adv = [s.advantage for s in batch.samples if s.group == g]
        assert abs(sum(adv)) < 1e-6
    frame = pd.read_parquet(RunStore(m.cfg.storage, m.cfg.run_name).uri("rollouts", "0000000.parquet"))
    assert len(frame) == 24 and set(frame["status"]) <= {"completed", "truncated", "failed"}
    # idempotent: a retried generate returns the same batch without sampling again
    assert m.generate(0) is summary


def test_rollouts_are_deterministic_per_rollout_id(engines, tmp_path):
    a = manager(engines, tmp_path / "a")
    b = manager(engines, tmp_path / "b")
    a.generate(3)
    b.generate(3)
    assert [s.response_ids for s in a.get_batch(3).samples] == [
        s.response_ids for s in b.get_batch(3).samples
    ]
    a.generate(4)
    assert [s.prompt for s in a.get_batch(4).samples] != [s.prompt for s in a.get_batch(3).samples]
    a.release(3)
    assert not a.has_batch(3)


def test_each_sample_has_its_own_seed_and_rid(engines, tmp_path):
    """A sample depends on its own seed only: the same rollout on one engine or split over
    two is identical, and the copies of a group are not one seed's repeats."""
    model, urls = engines
    two = manager(engines, tmp_path / "two")
    one = manager((model, urls[:1]), tmp_path / "one", cluster={"engines": {"num_workers": 1}})
    two.generate(5)
    one.generate(5)
    samples = two.get_batch(5).samples
    assert [s.response_ids for s in samples] == [s.response_ids for s in one.get_batch(5).samples]
    groups = [[tuple(s.response_ids) for s in samples if s.group == g] for g in range(6)]
    assert sum(len(set(g)) > 1 for g in groups) >= 4  # near-uniform tiny model: copies differ


def test_evaluate_reports_pass_at_k(engines, tmp_path):
    result = manager(engines, tmp_path, data={"reward": "exact_match"}).evaluate(0)
    assert result["eval_num_samples"] == 5 * 4
    assert 0.0 <= result["eval_pass@1"] <= result["eval_pass@4"] <= 1.0
    assert result["examples"] and {"prompt", "response", "label", "reward"} <= set(result["examples"][0])


def test_multi_token_stop_is_refused(engines, tmp_path):
    with pytest.raises(ValueError, match="rollout.sampling.stop"):
        manager(engines, tmp_path, rollout={"sampling": {"stop": ["END"]}})


@pytest.mark.parametrize("resample", ["all", "stuck"])
def test_dynamic_sampling_keeps_groups_with_signal(engines, tmp_path, resample):
    rollout = {
        "prompts_per_rollout": 6,
        "n_samples_per_prompt": 4,
        "sampling": {"max_new_tokens": 3},
        "dynamic_sampling": True,
        "dynamic_sampling_max_rounds": 2,
        "dynamic_sampling_resample": resample,
    }
    m = manager(engines, tmp_path, rollout=rollout)
    summary = m.generate(0)
    samples = m.get_batch(0).samples
    assert len(samples) == 24 and sorted({s.group for s in samples}) == list(range(6))
    flat = sum(len({s.reward for s in samples if s.group == g}) == 1 for g in range(6))
    # only groups taken to fill a batch still short after the extra rounds may be flat
    assert flat == summary["dynamic_sampling_filled_groups"]
    assert summary["zero_variance_group_frac"] == flat / 6
    assert 1 <= summary["dynamic_sampling_rounds"] <= 3
    for g in range(6):  # advantages are computed on the final groups
        assert abs(sum(s.advantage for s in samples if s.group == g)) < 1e-6
    # reward_mean is the first round's (the policy's own score); the batch's is kept beside it
    batch_mean = sum(s.reward for s in samples) / len(samples)
    assert summary["dynamic_sampling_batch_reward_mean"] == pytest.approx(batch_mean)
    # deterministic: a second manager draws the same rounds
    again = manager(engines, tmp_path / "again", rollout=rollout)
    again.generate(0)
    assert [s.response_ids for s in again.get_batch(0).samples] == [s.response_ids for s in samples]
    # a resumed run adopts the stored batch and reports what the straight run reported
    resumed = manager(engines, tmp_path, rollout=rollout)
    resumed.restore(m.prompt_state(1), prefetched_rollout=0)
    adopted = resumed.generate(0)
    assert [s.response_ids for s in resumed.get_batch(0).samples] == [s.response_ids for s in samples]
    timings = ("time_generate_s", "time_rollout_s")
    assert {k: v for k, v in adopted.items() if k not in timings} == {
        k: v for k, v in summary.items() if k not in timings
    }
    # and draws the next batch as the straight run does (`stuck` reads the run's rewards so far)
    assert summary["dynamic_sampling_samples"] <= summary["dynamic_sampling_rounds"] * 24
    straight, after_resume = m.generate(1), resumed.generate(1)
    assert [s.response_ids for s in resumed.get_batch(1).samples] == [
        s.response_ids for s in m.get_batch(1).samples
    ]
    assert {k: v for k, v in after_resume.items() if k not in timings} == {
        k: v for k, v in straight.items() if k not in timings
    }
    # sync mode generates none ahead: the run's rewards so far come from the trained rollout's
    # file (here a range wider than any reward the engine's samples score, so it must be read)
    _, stored = read_rollout_with_stats(m.store, 0)
    wide = {**stored, "dynamic_sampling_reward_low": -5.0, "dynamic_sampling_reward_high": 7.0}
    write_rollout(m.store, 0, m.get_batch(0).samples, wide)
    synced = manager(engines, tmp_path, rollout=rollout)
    synced.restore(m.prompt_state(1), prefetched_rollout=None, last_trained=0)
    after_sync_resume = synced.generate(1)
    assert (
        after_sync_resume["dynamic_sampling_reward_low"],
        after_sync_resume["dynamic_sampling_reward_high"],
    ) == (
        -5.0,
        7.0,
    )
    afresh = manager(engines, tmp_path / "afresh", rollout=rollout)  # no file of rollout 0 there
    afresh.restore(m.prompt_state(1), prefetched_rollout=None, last_trained=0)
    assert afresh.generate(1)["dynamic_sampling_reward_high"] <= 1.0


def failing_reward(prompt: str, response: str, label: str, **kw) -> float:
    # rewards run in processes of their own: each call leaves a line in the file its label names
    with open(label, "a") as f:
        f.write(prompt + "\n")
    raise RuntimeError("the grader is down")


def test_over_sampling_on_the_built_in_engine_keeps_whole_groups_with_dynamic_sampling(engines, tmp_path):
    rollout = {
        "prompts_per_rollout": 6,
        "over_sample_prompts": 3,
        "n_samples_per_prompt": 4,
        "sampling": {"max_new_tokens": 3},
        "dynamic_sampling_max_rounds": 2,
    }
    m = manager(engines, tmp_path, rollout=rollout)
    drawn = [m.formatter.text(row["prompt"]) for row in m.source.batch(0)]
    summary = m.generate(0)
    samples = m.get_batch(0).samples
    assert len(drawn) == 9 and len(samples) == 24
    assert sorted({s.group for s in samples}) == list(range(6))
    assert all(s.status != "aborted" and s.prompt in drawn for s in samples)
    # every group drawn beyond the batch is accounted for: never sent, or sent and thrown away
    thrown = summary["over_sample_wasted_samples"] // 4 + summary["over_sample_unsent_groups"]
    assert thrown == 3 and summary["prompts_dropped"] == 0
    assert summary["dynamic_sampling_rounds"] >= 1  # extra rounds draw from the kept prompts
    for g in range(6):
        assert abs(sum(s.advantage for s in samples if s.group == g)) < 1e-6
    # a resume adopts the stored batch as it was
    resumed = manager(engines, tmp_path, rollout=rollout)
    resumed.restore(m.prompt_state(1), prefetched_rollout=0)
    resumed.generate(0)
    assert [s.response_ids for s in resumed.get_batch(0).samples] == [s.response_ids for s in samples]


def test_a_failing_reward_stops_at_the_first_round_of_dynamic_sampling(engines, tmp_path):
    # every sample fails alike, so every group is flat: the extra rounds would draw them all again
    calls = tmp_path / "calls.txt"
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"{i}:", "label": str(calls)}) + "\n" for i in range(6)))
    rollout = {"prompts_per_rollout": 6, "n_samples_per_prompt": 4, "sampling": {"max_new_tokens": 2}}
    m = manager(
        engines,
        tmp_path,
        rollout={**rollout, "dynamic_sampling": True, "dynamic_sampling_max_rounds": 8},
        data={
            "train_path": str(data),
            "eval_path": str(data),
            "reward": f"{__name__}:failing_reward",
            "max_failed_fraction": 0.5,
        },
    )
    with pytest.raises(TooManyFailedSamples, match="24 of 24 samples failed"):
        m.generate(0)
    assert len(calls.read_text().splitlines()) == 24  # one round, not nine
    frame = pd.read_parquet(RunStore(m.cfg.storage, m.cfg.run_name).uri("rollouts", "0000000.parquet"))
    assert len(frame) == 24 and set(frame["status"]) == {"failed"}  # the errors are on file


def test_held_rollouts_stay_bounded_over_many_iterations(engines, tmp_path):
    m = manager(engines, tmp_path, rollout={"prompts_per_rollout": 2, "n_samples_per_prompt": 2})
    for k in range(12):
        summary = m.generate(k)
        assert m.generate(k) is summary  # the latest rollout's retry still finds its summary
        m.release(k)  # the actor trained on it (no critic): its batch goes
    held = m.held()
    assert held["batches"] == held["stored"] == 0
    assert held["summaries"] <= KEEP_SUMMARIES < 12


def test_batch_is_in_the_object_store_once_generated_and_leaves_with_its_release(engines, tmp_path):
    # as the run builds it: a threaded Ray actor; the ranks get the ref batch_ref returns
    import ray

    from infra.cluster.ray_cluster import runtime_env

    model, urls = engines
    ray.init(num_cpus=1, include_dashboard=False, runtime_env=runtime_env("", {}))  # the repo on the path
    try:
        actor = ray.remote(RolloutManager).options(max_concurrency=4).remote(config(tmp_path), urls, model)
        ray.get(actor.generate.remote(0))
        assert ray.get(actor.held.remote())["stored"] == 1  # put while generating, before any ask
        ref = ray.get(actor.batch_ref.remote(0))
        assert isinstance(ref, ray.ObjectRef) and ray.get(actor.batch_ref.remote(0)) == ref
        batch, direct = ray.get(ref), ray.get(actor.get_batch.remote(0))
        assert [s.response_ids for s in batch.samples] == [s.response_ids for s in direct.samples]
        ray.get(actor.release.remote(0))
        assert ray.get(actor.held.remote()) == {"batches": 0, "summaries": 1, "stored": 0}
        with pytest.raises(ray.exceptions.RayTaskError, match="was not generated"):
            ray.get(actor.batch_ref.remote(0))
    finally:
        ray.shutdown()


def test_a_train_file_without_eval_path_evaluates_on_rows_it_never_trains_on(engines, tmp_path):
    rows = [{"prompt": f"{i % 10}{i // 10}:", "label": str(i % 10)} for i in range(40)]
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    over = {
        "data": {"train_path": str(data), "reward": "exact_match"},
        "eval": {"num_prompts": 64, "n_samples": 2, "pass_k": [1, 2]},
    }
    m = manager(engines, tmp_path / "a", **over)
    (held,) = m.eval_sets
    assert len(held.rows) == 2  # 5% of 40
    trained = {r["prompt"] for r in m.source.rows}
    assert len(trained) == 38 and trained.isdisjoint(r["prompt"] for r in held.rows)
    assert manager(engines, tmp_path / "b", **over).eval_sets[0].rows == held.rows  # seeded
    assert m.evaluate(0)["eval_num_samples"] == 2 * 2
