"""Prefect retries only transient faults: a deterministic error (also as Ray re-raises an
actor's error) fails the task at once, so its message appears once, not per retry."""

from prefect.states import Failed
from ray.exceptions import RayTaskError

from infra.cluster.rank_group import TrainerRankDied
from infra.engines.client import EngineError
from infra.errors import is_deterministic
from infra.rollout.scoring import TooManyFailedSamples
from infra.storage.retry import StorageUnavailable
from tasks.options import RETRIED, retry_transient_only


def from_actor(exc: BaseException) -> BaseException:
    return RayTaskError("RolloutManager.generate", "traceback", exc).as_instanceof_cause()


def test_deterministic_errors_are_not_retried():
    for exc in (
        ValueError("data.train_path: no rows"),
        ImportError("x"),
        FileNotFoundError("f"),
        TooManyFailedSamples("60 of 64"),
        TrainerRankDied("trainer rank 1 died during save"),
    ):
        assert is_deterministic(exc) and is_deterministic(from_actor(exc))
        assert not retry_transient_only(None, None, Failed(data=from_actor(exc)))


def test_transient_errors_are_retried():
    for exc in (EngineError("engine down"), StorageUnavailable("s3 down"), ConnectionResetError()):
        assert not is_deterministic(from_actor(exc))
        assert retry_transient_only(None, None, Failed(data=from_actor(exc)))
    assert RETRIED["retry_condition_fn"] is retry_transient_only and RETRIED["retries"] >= 2
