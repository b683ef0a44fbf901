import pytest

from infra.config import RunConfig
from infra.data.prompts import PromptSource
from infra.schedule import LoopSchedule, batch_ends_epoch


def make(num_prompts=10**6, **kw):
    cfg = RunConfig.model_validate(kw)
    return LoopSchedule.from_config(cfg, num_prompts)


def fired(pred, n):
    return [k for k in range(n) if pred(k)]


def test_save_every_interval_at_epoch_ends_and_last():
    # 25 prompts in batches of 5: epochs end with batches 4 and 9
    s = make(25, num_rollout=12, checkpoint={"save_interval": 3}, rollout={"prompts_per_rollout": 5})
    assert fired(s.save_after, 12) == [2, 4, 5, 8, 9, 11]


def test_eval_every_interval_and_epoch_end_not_forced_at_last():
    s = make(25, num_rollout=12, eval={"interval": 5}, rollout={"prompts_per_rollout": 5})
    assert fired(s.eval_after, 12) == [4, 9]
    never = make(1, num_rollout=4, eval={"interval": None})
    assert fired(never.eval_after, 4) == []


@pytest.mark.parametrize(("rows", "batch"), [(7, 3), (10, 5), (3, 7), (64, 64), (100, 64)])
def test_epoch_ends_match_the_prompt_stream(rows, batch):
    """The flow's schedule and the manager's prompt stream agree on every epoch end."""
    cfg = RunConfig(num_rollout=40, rollout={"prompts_per_rollout": batch})
    s = LoopSchedule.from_config(cfg, rows)
    source = PromptSource([{"prompt": str(i), "label": ""} for i in range(rows)], batch, 0)
    ends = fired(s.ends_epoch, 40)
    assert ends == fired(source.ends_epoch, 40)
    # a batch ends an epoch exactly when the next batch starts in a later epoch
    assert ends == [k for k in range(40) if source.epoch_of(k + 1) > source.epoch_of(k)]
    assert batch_ends_epoch(0, batch, rows) == (batch >= rows)


def test_no_train_prompts_is_an_error():
    with pytest.raises(ValueError, match="data.train_path"):
        LoopSchedule.from_config(RunConfig(), 0)


def test_sync_every_interval_and_at_the_end():
    s = make(num_rollout=7, update_weights_interval=3)
    assert fired(s.sync_after, 7) == [2, 5, 6]
    assert fired(make(num_rollout=3).sync_after, 3) == [0, 1, 2]


def test_next_and_hf_export():
    s = make(num_rollout=5, checkpoint={"hf_export_interval": 2})
    assert [s.has_next(k) for k in range(5)] == [True, True, True, True, False]
    assert fired(s.export_hf_after, 5) == [1, 3, 4]
    assert all(s.actor_trains(k) for k in range(5))


def test_iterations_per_run_stops_early_and_checkpoints():
    cfg = RunConfig(num_rollout=10, iterations_per_run=3, checkpoint={"save_interval": None})
    s = LoopSchedule.from_config(cfg, 10**6, start=6)
    assert s.num_rollout == 9 and s.is_last(8) and not s.has_next(8)
    assert fired(s.save_after, 9) == [8]  # the stop is checkpointed for the next run
    tail = LoopSchedule.from_config(cfg, 10**6, start=8)
    assert tail.num_rollout == 10  # never past num_rollout


def test_train_ahead_never_across_a_save_or_past_the_end():
    s = make(num_rollout=6, checkpoint={"save_interval": 2})
    assert fired(s.save_after, 6) == [1, 3, 5]
    assert fired(s.train_ahead, 6) == [0, 2, 4]


def test_generate_behind_a_sync_never_across_a_save_or_an_eval_or_past_the_end():
    s = make(num_rollout=8, update_weights_interval=2, checkpoint={"save_interval": 4}, eval={"interval": 3})
    assert fired(s.sync_after, 8) == [1, 3, 5, 7]
    assert fired(s.save_after, 8) == [3, 7] and fired(s.eval_after, 8) == [2, 5]
    # of the syncs after 1, 3, 5 and 7: not 3 and 7 (saves) nor 5 (an eval)
    assert [k for k in range(8) if s.generate_behind_sync(k, k + 2)] == [1]
    assert s.generate_behind_sync(1, 7) and not s.generate_behind_sync(1, 8)  # 8 is past the end
