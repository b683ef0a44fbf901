"""The shared retry policy (infra/retry.py): what is retried, how long, and readiness polls."""

from __future__ import annotations

import time

import httpx
import pytest
from tenacity import RetryError

from infra.retry import Unavailable, backoff, is_transient, poll


def _status_error(status: int) -> httpx.HTTPStatusError:
    request = httpx.Request("POST", "http://rm/score")
    return httpx.HTTPStatusError("answer", request=request, response=httpx.Response(status, request=request))


def test_http_answers_and_transport_faults() -> None:
    for status in (500, 503, 408, 429):
        assert is_transient(_status_error(status)), status
    for status in (400, 401, 404, 422):
        assert not is_transient(_status_error(status)), status
    assert is_transient(httpx.ConnectError("refused"))
    assert is_transient(httpx.ReadTimeout("slow"))
    # a window already waited out is not waited out again by an outer retry
    assert not is_transient(Unavailable("s3 down for 60 s"))


def test_backoff_doubles_and_stops_after_the_attempts() -> None:
    calls: list[float] = []

    def down() -> None:
        calls.append(time.monotonic())
        raise ConnectionRefusedError("down")

    with pytest.raises(RetryError) as spent:
        backoff("op", first_delay_s=0.05, attempts=4)(down)
    assert spent.value.last_attempt.attempt_number == 4 and len(calls) == 4
    assert isinstance(spent.value.last_attempt.exception(), ConnectionRefusedError)
    gaps = [b - a for a, b in zip(calls, calls[1:], strict=False)]
    # 0.05, 0.1, 0.2 s (sleeps are at least as long as asked)
    for gap, want in zip(gaps, (0.05, 0.1, 0.2), strict=True):
        assert want <= gap < want + 0.15, gaps


def test_backoff_cuts_the_last_wait_to_end_at_the_timeout() -> None:
    calls: list[float] = []

    def down() -> None:
        calls.append(time.monotonic())
        raise TimeoutError

    t0 = time.monotonic()
    with pytest.raises(RetryError):
        # waits 0.4 then 0.8 s, the second cut to end at 0.6 s, then one last attempt
        backoff("op", first_delay_s=0.4, timeout_s=0.6)(down)
    assert len(calls) == 3
    assert 0.55 <= calls[-1] - t0 < 0.9


def test_backoff_raises_a_fault_of_the_request_at_once() -> None:
    calls: list[int] = []

    def refused() -> None:
        calls.append(1)
        raise _status_error(422)

    with pytest.raises(httpx.HTTPStatusError):
        backoff("op", first_delay_s=0.01, attempts=5)(refused)
    assert len(calls) == 1
    with pytest.raises(ValueError, match="timeout_s, attempts"):
        backoff("op", first_delay_s=0.01)


def test_poll_returns_the_first_true_value() -> None:
    answers = iter([None, ConnectionRefusedError(), 0, "ready", "late"])

    def check() -> object:
        value = next(answers)
        if isinstance(value, BaseException):
            raise value  # not listening yet: counts as not ready
        return value

    assert poll(check, timeout_s=5, interval_s=0.01) == "ready"


def test_poll_gives_the_last_value_after_the_timeout() -> None:
    t0 = time.monotonic()
    assert poll(lambda: [], timeout_s=0.3, interval_s=0.05) == []
    assert 0.3 <= time.monotonic() - t0 < 1.0

    def never_listening() -> bool:
        raise ConnectionRefusedError

    assert poll(never_listening, timeout_s=0.2, interval_s=0.05) is None


def test_poll_raises_other_faults_at_once() -> None:
    calls: list[int] = []

    def exited() -> bool:
        calls.append(1)
        raise RuntimeError("the server exited with code 1")

    with pytest.raises(RuntimeError, match="exited"):
        poll(exited, timeout_s=5, interval_s=0.01)
    assert len(calls) == 1
