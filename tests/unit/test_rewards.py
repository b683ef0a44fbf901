import asyncio
import threading
import time

import pytest

from infra.data.rewards import REWARDS, resolve_reward, score


def length_reward(prompt: str, response: str, label: str, **kw) -> float:
    return float(len(response)) * kw.get("scale", 1.0)


async def slow_async_reward(prompt: str, response: str, label: str, **kw) -> float:
    await asyncio.sleep(0.2)
    return float(response == label)


def test_registered_rewards() -> None:
    em, pm, co, nm = (REWARDS[n] for n in ("exact_match", "prefix_match", "contains", "numeric_match"))
    assert em("1+2=", " 3\n", "3") == 1.0
    assert em("1+2=", "3</s>", "3") == 1.0
    assert em("1+2=", "3.", "3", stop=["."]) == 1.0
    assert em("1+2=", "34", "3") == 0.0
    assert pm("1+2=", "34", "3") == 1.0 and pm("1+2=", "43", "3") == 0.0
    assert co("", "the answer is 3!", "3") == 1.0 and co("", "none", "3") == 0.0
    assert nm("", "x = 9.0 or 8", "9") == 1.0 and nm("", "8 then 9", "9") == 0.0
    assert nm("", "no number", "9") == 0.0 and nm("", "-2.5", "-2.5") == 1.0


def test_char_match_gives_partial_credit_per_position() -> None:
    cm = REWARDS["char_match"]
    assert cm("23+45=", "68", "68") == 1.0 and cm("23+45=", " 68\n", "68", stop=["\n"]) == 1.0
    assert cm("23+45=", "67", "68") == 0.5 and cm("23+45=", "86", "68") == 0.0
    assert cm("23+45=", "6", "68") == 0.5 and cm("23+45=", "681", "68") == pytest.approx(2 / 3)
    assert cm("23+45=", "", "68") == 0.0


def test_resolve_by_name_and_dotted_path() -> None:
    assert resolve_reward("exact_match") is REWARDS["exact_match"]
    assert resolve_reward(f"{__name__}:length_reward") is length_reward
    for bad in ("nope", f"{__name__}:missing", "no_such_module_xyz:f", f"{__name__}:REWARDS_NOT"):
        with pytest.raises(ValueError, match=rf"{bad}.*exact_match.*numeric_match"):
            resolve_reward(bad)


def test_score_sync_with_kwargs() -> None:
    results = score(length_reward, [("p", "ab", "l"), ("p", "", "l")], scale=0.5)
    assert [(r.reward, r.status, r.error) for r in results] == [
        (1.0, "completed", ""),
        (0.0, "completed", ""),
    ]


def test_async_rewards_run_concurrently() -> None:
    items = [("p", str(i % 2), "1") for i in range(10)]
    start = time.monotonic()
    results = score(slow_async_reward, items)
    assert time.monotonic() - start < 1.0  # 10 x 0.2 s if they ran one after another
    assert [r.reward for r in results] == [0.0, 1.0] * 5


def test_score_from_a_thread_and_from_inside_a_running_loop() -> None:
    out: list = []
    thread = threading.Thread(target=lambda: out.append(score(slow_async_reward, [("p", "1", "1")])))
    thread.start()
    thread.join()

    async def inside_loop() -> list:
        return score(slow_async_reward, [("p", "1", "1")])

    out.append(asyncio.run(inside_loop()))
    assert [r[0].reward for r in out] == [1.0, 1.0]


def test_failures_are_isolated() -> None:
    def flaky(prompt: str, response: str, label: str, **kw) -> float:
        if response == "boom":
            raise RuntimeError("judge down")
        return {"nan": float("nan"), "str": "1"}.get(response, 1.0)  # type: ignore[return-value]

    async def async_flaky(prompt: str, response: str, label: str, **kw) -> float:
        return flaky(prompt, response, label)

    for fn in (flaky, async_flaky):
        results = score(fn, [("p", "ok", "l"), ("p", "boom", "l"), ("p", "nan", "l"), ("p", "str", "l")])
        assert [(r.reward, r.status) for r in results] == [(1.0, "completed")] + [(0.0, "failed")] * 3
        assert "RuntimeError: judge down" in results[1].error
        assert "finite number" in results[2].error and "'1'" in results[3].error
    bad_label = score(REWARDS["numeric_match"], [("p", "3", "three")])[0]
    assert bad_label.status == "failed" and "three" in bad_label.error


def sleepy_reward(prompt: str, response: str, label: str, **kw) -> float:
    if response == "hang":
        time.sleep(3)
    return 1.0


async def sleepy_async_reward(prompt: str, response: str, label: str, **kw) -> float:
    if response == "hang":
        await asyncio.sleep(3)
    return 1.0


@pytest.mark.parametrize("fn", [sleepy_reward, sleepy_async_reward])
def test_a_reward_call_past_its_timeout_fails_only_its_sample(fn) -> None:
    items = [("p", "ok", "l"), ("p", "hang", "l"), ("p", "ok", "l")]
    t0 = time.monotonic()
    results = score(fn, items, timeout_s=0.5)
    assert time.monotonic() - t0 < 2.5
    assert [r.status for r in results] == ["completed", "failed", "completed"]
    assert "reward_timeout_s=0.5" in results[1].error and results[1].reward == 0.0


def test_registered_linear_time_rewards_are_scored_in_line(monkeypatch) -> None:
    """exact_match and its kin cannot hang: no reward thread per sample, even with a timeout;
    a bad label still fails only its own sample."""
    import infra.data.rewards as rewards

    def no_threads(*a, **kw):
        raise AssertionError("a linear-time reward went through the reward threads")

    monkeypatch.setattr(rewards, "_call_all_with_timeout", no_threads)
    for fn in rewards.LINEAR_TIME_REWARDS:
        assert len(score(fn, [("p", "7", "7")] * 3, timeout_s=30.0)) == 3
    results = score(rewards.numeric_match, [("p", "7", "7"), ("p", "7", "seven")], timeout_s=30.0)
    assert [r.status for r in results] == ["completed", "failed"] and results[0].reward == 1.0
    assert "ValueError" in results[1].error
    with pytest.raises(AssertionError, match="reward threads"):  # any other reward still does
        score(sleepy_reward, [("p", "ok", "l")], timeout_s=30.0)


def test_reward_from_a_file_path(tmp_path) -> None:
    plugin = tmp_path / "grader.py"
    plugin.write_text("def score(prompt, response, label, **kw):\n    return 0.25\n")
    fn = resolve_reward(f"{plugin}:score")
    assert fn("p", "r", "l") == 0.25
    with pytest.raises(ValueError, match="no such file"):
        resolve_reward(f"{tmp_path / 'missing.py'}:score")


def test_too_many_failed_samples_stop_the_run() -> None:
    from infra.rollout.batch import Sample
    from infra.rollout.scoring import TooManyFailedSamples, check_failures

    def sample(status: str) -> Sample:
        return Sample("p", "l", "r", [1], [2], [0.0], 0, 0, status=status, error="boom")

    check_failures([sample("failed"), sample("completed")], 0.5, "u")  # 50% is allowed
    with pytest.raises(TooManyFailedSamples, match=r"2 of 3 samples failed .*max_failed_fraction=0.5.*boom"):
        check_failures([sample("failed"), sample("failed"), sample("completed")], 0.5, "u")


def huge_reward(prompt: str, response: str, label: str, **kw) -> float:
    return float(response)


@pytest.mark.parametrize("value", ["1e308", "-1e308", "1000001", "-1e7", "inf", "nan"])
def test_absurd_rewards_fail_their_sample_naming_the_reward(value) -> None:
    ok, bad = score(huge_reward, [("p", "0.5", "l"), ("p", value, "l")])
    assert (ok.reward, ok.status) == (0.5, "completed")
    assert (bad.reward, bad.status) == (0.0, "failed")
    assert "tests.unit.test_rewards:huge_reward" in bad.error and "+-1e+06" in bad.error


def test_rewards_at_the_bound_and_bools_are_scores() -> None:
    results = score(huge_reward, [("p", "1e6", "l"), ("p", "-1e6", "l")])
    assert [(r.reward, r.status) for r in results] == [(1e6, "completed"), (-1e6, "completed")]
    (flag,) = score(lambda p, r, lab, **kw: r == lab, [("p", "a", "a")])
    assert (flag.reward, flag.status) == (1.0, "completed")


def test_absurd_rewards_never_reach_the_advantages() -> None:
    import math

    from infra.config import AlgorithmConfig
    from infra.rollout.batch import Sample
    from infra.rollout.scoring import score_samples

    samples = [Sample("p", "l", r, [1], [2], [0.0], 0, 0) for r in ("1e308", "1e308", "1", "0")]
    for s in samples[2:]:
        s.group = 1
    score_samples(samples, huge_reward, AlgorithmConfig())
    assert all(math.isfinite(s.advantage) for s in samples)
    assert [s.status for s in samples] == ["failed", "failed", "completed", "completed"]


def test_a_batch_reward_is_named_too() -> None:
    from infra.data.group_rewards import batch_reward

    @batch_reward
    def overflowing(prompts, responses, labels, **kw):
        return [1e308 for _ in prompts]

    (bad,) = score(overflowing, [("p", "r", "l")])
    assert bad.status == "failed" and "overflowing" in bad.error
