from infra.rollout.batch import Sample
from infra.rollout.dynamic_sampling import fill_with_signal


def _round(rewards_per_group: list[list[float]], tag: str) -> list[Sample]:
    return [
        Sample(prompt=f"{tag}{g}", label="", response="", prompt_ids=[1], response_ids=[2],
               engine_logprobs=[0.0], weight_version=0, group=g, reward=r)
        for g, rewards in enumerate(rewards_per_group) for r in rewards
    ]  # fmt: skip


def test_flat_groups_dropped_and_batch_refilled_from_new_rounds():
    rounds = {
        0: [[1, 1], [0, 1], [0, 0]],  # one group with signal
        1: [[1, 1], [1, 0], [0, 1]],  # two more
    }
    calls = []

    def draw(r, prompts):
        calls.append(r)
        assert prompts == list(range(len(rounds[r])))  # `all`: every prompt, every round
        return _round(rounds[r], f"r{r}-")

    samples, stats = fill_with_signal(draw, num_groups=3, max_extra_rounds=3)
    assert calls == [0, 1]  # stops as soon as 3 groups carry signal
    assert [s.prompt for s in samples] == ["r0-1"] * 2 + ["r1-1"] * 2 + ["r1-2"] * 2
    assert [s.group for s in samples] == [0, 0, 1, 1, 2, 2]
    assert stats == {
        "dynamic_sampling_rounds": 2,
        "dynamic_sampling_samples": 12,
        "dynamic_sampling_dropped_groups": 3,
        "dynamic_sampling_filled_groups": 0,
        "dynamic_sampling_batch_reward_mean": 0.5,
        "dynamic_sampling_reward_low": 0,
        "dynamic_sampling_reward_high": 1,
        "reward_mean": 0.5,  # round 0 alone: 3 of 6 right
    }


def test_cap_on_rounds_fills_with_flat_groups():
    def draw(r, prompts):
        return _round([[1, 1], [0, 1]], f"r{r}-")

    samples, stats = fill_with_signal(draw, num_groups=2, max_extra_rounds=0)
    # one round only: the varied group, then a flat one to keep the batch full
    assert [s.prompt for s in samples] == ["r0-1", "r0-1", "r0-0", "r0-0"]
    assert stats["dynamic_sampling_filled_groups"] == 1 and stats["dynamic_sampling_dropped_groups"] == 0


def test_a_round_without_signal_does_not_end_the_search():
    # late in a run most prompts are answered one way on every sample; a later round may
    # still hold the rare group that disagrees, which is the only signal for a stuck prompt
    rounds = {0: [[0, 0], [0, 0]], 1: [[0, 1], [0, 0]], 2: [[1, 1], [0, 0]], 3: [[0, 0], [1, 0]]}
    calls = []

    def draw(r, prompts):
        calls.append(r)
        assert prompts == list(range(len(rounds[r])))  # `all`: every prompt, every round
        return _round(rounds[r], f"r{r}-")

    samples, stats = fill_with_signal(draw, num_groups=2, max_extra_rounds=3)
    assert calls == [0, 1, 2, 3]
    assert [s.prompt for s in samples][::2] == ["r1-0", "r3-1"]
    assert stats == {
        "dynamic_sampling_rounds": 4,
        "dynamic_sampling_samples": 16,
        "dynamic_sampling_dropped_groups": 6,
        "dynamic_sampling_filled_groups": 0,
        "dynamic_sampling_batch_reward_mean": 0.5,
        "dynamic_sampling_reward_low": 0,
        "dynamic_sampling_reward_high": 1,
        "reward_mean": 0.0,  # the first round's: nothing right yet
    }


def _draw_of(rounds: dict[int, dict[int, list[float]]], calls: list):
    """draw(round, prompts) answering each drawn prompt with its scripted rewards that round."""

    def draw(r, prompts):
        calls.append((r, list(prompts)))
        return [
            Sample(prompt=f"r{r}-p{p}", label="", response="", prompt_ids=[1], response_ids=[2],
                   engine_logprobs=[0.0], weight_version=0, group=i, reward=x)
            for i, p in enumerate(prompts) for x in rounds[r][p]
        ]  # fmt: skip

    return draw


def test_stuck_draws_again_only_the_prompts_without_signal_below_the_best():
    # prompt 0 solved (every sample right), 1 stuck (all wrong), 2 with signal
    rounds = {0: {0: [1, 1], 1: [0, 0], 2: [0, 1]}, 1: {1: [1, 0]}}
    calls: list = []
    samples, stats = fill_with_signal(_draw_of(rounds, calls), 3, max_extra_rounds=5, resample="stuck")
    assert calls == [(0, [0, 1, 2]), (1, [1])]  # then nothing is left to draw
    # the two groups with signal, then the solved prompt's group fills the batch
    assert [s.prompt for s in samples][::2] == ["r0-p2", "r1-p1", "r0-p0"]
    assert stats["dynamic_sampling_rounds"] == 2 and stats["dynamic_sampling_samples"] == 8
    assert stats["dynamic_sampling_filled_groups"] == 1


def test_stuck_draws_every_prompt_while_no_reward_differs():
    flat = {r: {0: [0, 0], 1: [0, 0]} for r in range(3)}
    calls: list = []
    _, stats = fill_with_signal(_draw_of(flat, calls), 2, max_extra_rounds=2, resample="stuck")
    assert calls == [(r, [0, 1]) for r in range(3)]  # nothing solved yet: the search goes on
    assert (stats["dynamic_sampling_reward_low"], stats["dynamic_sampling_reward_high"]) == (0, 0)
    # a run that has scored 1 before: the same flat 0s are stuck and drawn again
    calls.clear()
    fill_with_signal(_draw_of(flat, calls), 2, max_extra_rounds=2, resample="stuck", seen=(0, 1))
    assert calls == [(r, [0, 1]) for r in range(3)]
    # and prompts flat at the run's best are solved: one round, no search
    solved = {0: {0: [1, 1], 1: [1, 1]}}
    calls.clear()
    _, stats = fill_with_signal(_draw_of(solved, calls), 2, max_extra_rounds=2, resample="stuck", seen=(0, 1))
    assert calls == [(0, [0, 1])] and stats["dynamic_sampling_filled_groups"] == 2
