from infra.config import RunConfig
from infra.schedule import LoopSchedule


def make(ends_epoch=lambda k: False, **kw):
    cfg = RunConfig.model_validate(kw)
    return LoopSchedule.from_config(cfg, ends_epoch)


def fired(pred, n):
    return [k for k in range(n) if pred(k)]


def test_save_every_interval_at_epoch_ends_and_last():
    s = make(lambda k: k in (4, 9), num_rollout=12, checkpoint={"save_interval": 3})
    assert fired(s.save_after, 12) == [2, 4, 5, 8, 9, 11]


def test_eval_every_interval_and_epoch_end_not_forced_at_last():
    s = make(lambda k: k == 4, num_rollout=12, eval={"interval": 5})
    assert fired(s.eval_after, 12) == [4, 9]
    never = make(lambda k: True, num_rollout=4, eval={"interval": None})
    assert fired(never.eval_after, 4) == []


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
    s = LoopSchedule.from_config(cfg, lambda k: False, start=6)
    assert s.num_rollout == 9 and s.is_last(8) and not s.has_next(8)
    assert fired(s.save_after, 9) == [8]  # the stop is checkpointed for the next run
    tail = LoopSchedule.from_config(cfg, lambda k: False, start=8)
    assert tail.num_rollout == 10  # never past num_rollout
