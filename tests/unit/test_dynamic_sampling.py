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

    def draw(r):
        calls.append(r)
        return _round(rounds[r], f"r{r}-")

    samples, stats = fill_with_signal(draw, num_groups=3, max_extra_rounds=3)
    assert calls == [0, 1]  # stops as soon as 3 groups carry signal
    assert [s.prompt for s in samples] == ["r0-1"] * 2 + ["r1-1"] * 2 + ["r1-2"] * 2
    assert [s.group for s in samples] == [0, 0, 1, 1, 2, 2]
    assert stats == {
        "dynamic_sampling_rounds": 2,
        "dynamic_sampling_dropped_groups": 3,
        "dynamic_sampling_filled_groups": 0,
        "dynamic_sampling_batch_reward_mean": 0.5,
        "reward_mean": 0.5,  # round 0 alone: 3 of 6 right
    }


def test_cap_on_rounds_fills_with_flat_groups():
    def draw(r):
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

    def draw(r):
        calls.append(r)
        return _round(rounds[r], f"r{r}-")

    samples, stats = fill_with_signal(draw, num_groups=2, max_extra_rounds=3)
    assert calls == [0, 1, 2, 3]
    assert [s.prompt for s in samples][::2] == ["r1-0", "r3-1"]
    assert stats == {
        "dynamic_sampling_rounds": 4,
        "dynamic_sampling_dropped_groups": 6,
        "dynamic_sampling_filled_groups": 0,
        "dynamic_sampling_batch_reward_mean": 0.5,
        "reward_mean": 0.0,  # the first round's: nothing right yet
    }
