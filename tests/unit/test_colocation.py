"""What the loop may submit ahead, and what the engines do around training, with and
without colocation (flows/colocation.py), against the schedule's rules."""

from flows.colocation import OwnDevices, SharedDevices, colocation
from infra.config import RunConfig
from infra.schedule import LoopSchedule


class Handles:
    def __init__(self):
        self.calls = []

    def release_engines(self):
        self.calls.append("release")
        return {"time_engine_release_s": 0.1}

    def resume_engines(self):
        self.calls.append("resume")
        return {"time_engine_resume_s": 0.2}


def policy(**kw):
    cfg = RunConfig.model_validate(kw)
    schedule = LoopSchedule.from_config(cfg, 10**6)
    return colocation(cfg, schedule), schedule


def test_own_devices_submit_the_sync_and_async_training_ahead_as_the_schedule_allows():
    devices, schedule = policy(
        mode="async", num_rollout=6, update_weights_interval=2, checkpoint={"save_interval": 3}
    )
    assert isinstance(devices, OwnDevices)
    assert [k for k in range(6) if devices.sync_ahead(k)] == [k for k in range(6) if schedule.sync_after(k)]
    assert [k for k in range(6) if devices.train_ahead(k)] == [
        0,
        1,
        3,
        4,
    ]  # not across a save, nor past the end
    # the generate two ahead (one is in flight) goes behind the syncs after 1 and 3; 5 saves
    assert [devices.generate_behind_sync(k) for k in range(6)] == [None, 3, None, 5, None, None]
    run = Handles()
    assert devices.release_engines(run) == {} and devices.resume_engines(run) == {} and run.calls == []


def test_sync_mode_never_trains_ahead_its_batch_is_not_generated_yet():
    devices, _ = policy(mode="sync", num_rollout=4)
    assert [k for k in range(4) if devices.sync_ahead(k)] == [0, 1, 2, 3]
    assert not any(devices.train_ahead(k) for k in range(4))
    # but its next generate goes behind each sync: on-policy, it samples once the sync is done
    assert [devices.generate_behind_sync(k) for k in range(4)] == [1, 2, 3, None]


def test_colocated_engines_give_the_devices_back_and_nothing_runs_ahead():
    devices, _ = policy(mode="sync", num_rollout=4, cluster={"colocate": True})
    assert isinstance(devices, SharedDevices)
    assert not any(devices.sync_ahead(k) or devices.train_ahead(k) for k in range(4))
    assert all(devices.generate_behind_sync(k) is None for k in range(4))
    run = Handles()
    assert devices.release_engines(run) == {"time_engine_release_s": 0.1}
    assert devices.resume_engines(run) == {"time_engine_resume_s": 0.2}
    assert run.calls == ["release", "resume"]
