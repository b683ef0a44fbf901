"""The retry policy that storage, the reward service and readiness polls share: which faults
are worth another try, and the waits between tries.

Only transient faults are retried (connection refused or dropped, timeouts, 5xx, 408 and
429 answers); a missing file, a denied or malformed request or bad credentials fail at
once, since waiting cannot fix them. tenacity runs the attempts and the waits: `backoff`
for an operation retried with exponential waits, `poll` for a readiness check repeated
until it holds.
"""

from __future__ import annotations

import asyncio
import errno
import logging
from collections.abc import Callable
from typing import TypeVar

from tenacity import (
    RetryCallState,
    Retrying,
    retry_if_exception,
    retry_if_result,
    stop_after_attempt,
    stop_after_delay,
    wait_exponential,
    wait_fixed,
)

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
# Answers that say the server is busy or failing, not that the request is wrong.
_TRANSIENT_STATUS = (408, 429)


class Unavailable(OSError):
    """An endpoint did not answer (or kept erroring) for a whole retry window. Not transient:
    the waiting is done, and an outer retry would only repeat it."""


def _transient_status(status: int) -> bool:
    return status >= 500 or status in _TRANSIENT_STATUS


def _botocore_transient(exc: BaseException) -> bool:
    try:
        from botocore import exceptions as bx
    except ImportError:  # a local-only install
        return False
    if isinstance(exc, bx.NoCredentialsError | bx.PartialCredentialsError | bx.ParamValidationError):
        return False
    if isinstance(exc, bx.ClientError):
        return _transient_status(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0))
    return isinstance(exc, bx.HTTPClientError | bx.ConnectionError)


def _http_client_transient(exc: BaseException) -> bool:
    import httpx

    if isinstance(exc, httpx.HTTPStatusError):
        return _transient_status(exc.response.status_code)
    if isinstance(exc, httpx.TransportError):  # refused, dropped, timed out
        return True
    try:
        import aiohttp
    except ImportError:
        return False
    return isinstance(exc, aiohttp.ClientError)


def is_transient(exc: BaseException) -> bool:
    """True for faults that a later attempt may not meet (the endpoint down, a dropped
    connection, a timeout, a server error); False for faults of the request itself."""
    if isinstance(exc, (Unavailable, *_DETERMINISTIC)):
        return False
    cause = exc.__cause__ or exc.__context__
    if isinstance(exc, OSError) and exc.errno == errno.EIO and cause is not None:
        return is_transient(cause)  # s3fs wraps every unknown answer as EIO: the cause decides
    if isinstance(exc, ConnectionError | TimeoutError | asyncio.TimeoutError):
        return True
    if _botocore_transient(exc) or _http_client_transient(exc):
        return True
    if isinstance(exc, OSError) and exc.errno in _TRANSIENT_ERRNOS:
        return True
    return cause is not None and cause is not exc and is_transient(cause)


def _log_retry(what: str) -> Callable[[RetryCallState], None]:
    def before_sleep(state: RetryCallState) -> None:
        exc = state.outcome.exception() if state.outcome else None
        log.warning(
            "%s: attempt %d failed (%s: %s); retrying", what, state.attempt_number, type(exc).__name__, exc
        )

    return before_sleep


def backoff(
    what: str,
    *,
    first_delay_s: float,
    timeout_s: float | None = None,
    attempts: int | None = None,
    max_delay_s: float = 8.0,
    retry_on: Callable[[BaseException], bool] = is_transient,
) -> Retrying:
    """Retries of an operation whose faults pass `retry_on`: waits of `first_delay_s`,
    doubling up to `max_delay_s`, until `timeout_s` has passed (the last wait is cut to end
    there, and one more attempt is made) or after `attempts` attempts. Call the result with
    the operation: `backoff(...)(op)`. When the retries are spent, tenacity raises
    `RetryError` (its `last_attempt` holds the last fault); any other fault is raised as is."""
    if timeout_s is None and attempts is None:
        raise ValueError("backoff: give timeout_s, attempts or both")
    if attempts is None:
        stop = stop_after_delay(timeout_s)
    elif timeout_s is None:
        stop = stop_after_attempt(attempts)
    else:
        stop = stop_after_delay(timeout_s) | stop_after_attempt(attempts)
    doubling = wait_exponential(multiplier=first_delay_s, max=max_delay_s)

    def wait(state: RetryCallState) -> float:
        if timeout_s is None:
            return doubling(state)
        return max(0.0, min(doubling(state), timeout_s - (state.seconds_since_start or 0.0)))

    return Retrying(retry=retry_if_exception(retry_on), stop=stop, wait=wait, before_sleep=_log_retry(what))


def poll(check: Callable[[], T], timeout_s: float, interval_s: float = 0.1) -> T | None:
    """Call `check` every `interval_s` until it returns a true value, and return that; after
    `timeout_s`, the last value it returned (None if its last call raised). A transient fault
    (the server not listening yet) counts as not ready; any other fault is raised at once."""
    return Retrying(
        retry=retry_if_result(lambda ready: not ready) | retry_if_exception(is_transient),
        stop=stop_after_delay(timeout_s),
        wait=wait_fixed(interval_s),
        retry_error_callback=lambda state: None if state.outcome.failed else state.outcome.result(),
    )(check)
