"""Retries of storage operations while an object store is unreachable or erroring.

The policy is the shared one (`infra.retry`): transient faults are retried with backoff,
others fail at once. When the time is spent the last error is raised as
`StorageUnavailable`, which names the operation and the URI.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from tenacity import RetryError

from infra.retry import Unavailable, backoff, is_transient

__all__ = ["StorageUnavailable", "is_transient", "with_retries"]

T = TypeVar("T")


class StorageUnavailable(Unavailable):
    """The object store did not answer (or kept erroring) for the whole retry window."""


def with_retries(op: Callable[[], T], what: str, timeout_s: float, first_delay_s: float = 0.25) -> T:
    """Run `op`, retrying transient faults with exponential backoff for up to `timeout_s`."""
    try:
        return backoff(what, first_delay_s=first_delay_s, timeout_s=timeout_s)(op)
    except RetryError as spent:
        exc = spent.last_attempt.exception()
        raise StorageUnavailable(
            f"{what}: storage unreachable or erroring for {timeout_s:.0f} s "
            f"({spent.last_attempt.attempt_number} attempts); last error: {type(exc).__name__}: {exc}"
        ) from exc
