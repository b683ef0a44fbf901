"""Retries of storage operations while an object store is unreachable or erroring.

Only transient faults are retried (connection refused or dropped, timeouts, 5xx answers);
a missing file, a denied request or bad credentials fail at once, since waiting cannot
fix them. When the time is spent the last error is raised as `StorageUnavailable`, which
names the operation and the URI.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import time
from collections.abc import Callable
from typing import TypeVar

log = logging.getLogger(__name__)
T = TypeVar("T")

# Errors that say something about the request, not the endpoint's health.
_DETERMINISTIC = (
    FileNotFoundError,
    FileExistsError,
    PermissionError,
    IsADirectoryError,
    NotADirectoryError,
    ValueError,
    TypeError,
    KeyError,
)
_TRANSIENT_ERRNOS = {
    errno.ECONNREFUSED,
    errno.ECONNRESET,
    errno.ECONNABORTED,
    errno.ETIMEDOUT,
    errno.EHOSTUNREACH,
    errno.ENETUNREACH,
    errno.EPIPE,
    errno.EIO,  # s3fs's translation of a 5xx answer
    errno.EBUSY,
}


class StorageUnavailable(OSError):
    """The object store did not answer (or kept erroring) for the whole retry window."""


def _botocore_transient(exc: BaseException) -> bool:
    try:
        from botocore import exceptions as bx
    except ImportError:  # a local-only install
        return False
    if isinstance(exc, bx.NoCredentialsError | bx.PartialCredentialsError | bx.ParamValidationError):
        return False
    if isinstance(exc, bx.ClientError):
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
        return status >= 500 or status in (408, 429)
    return isinstance(exc, bx.HTTPClientError | bx.ConnectionError)


def is_transient(exc: BaseException) -> bool:
    """True for faults that a later attempt may not meet (the endpoint down, a dropped
    connection, a timeout, a server error); False for faults of the request itself."""
    if isinstance(exc, (StorageUnavailable, *_DETERMINISTIC)):
        return False
    cause = exc.__cause__ or exc.__context__
    if isinstance(exc, OSError) and exc.errno == errno.EIO and cause is not None:
        return is_transient(cause)  # s3fs wraps every unknown answer as EIO: the cause decides
    if isinstance(exc, ConnectionError | TimeoutError | asyncio.TimeoutError):
        return True
    if _botocore_transient(exc):
        return True
    try:
        import aiohttp

        if isinstance(exc, aiohttp.ClientError):
            return True
    except ImportError:
        pass
    if isinstance(exc, OSError) and exc.errno in _TRANSIENT_ERRNOS:
        return True
    return cause is not None and cause is not exc and is_transient(cause)


def with_retries(op: Callable[[], T], what: str, timeout_s: float, first_delay_s: float = 0.25) -> T:
    """Run `op`, retrying transient faults with exponential backoff for up to `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    delay, attempt = first_delay_s, 1
    while True:
        try:
            return op()
        except Exception as exc:
            if not is_transient(exc):
                raise
            left = deadline - time.monotonic()
            if left <= 0:
                raise StorageUnavailable(
                    f"{what}: storage unreachable or erroring for {timeout_s:.0f} s "
                    f"({attempt} attempts); last error: {type(exc).__name__}: {exc}"
                ) from exc
            log.warning("%s: attempt %d failed (%s: %s); retrying", what, attempt, type(exc).__name__, exc)
            time.sleep(min(delay, left))
            delay, attempt = min(delay * 2, 8.0), attempt + 1
