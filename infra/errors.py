"""Which failures are worth a retry.

A retry helps against transient faults (an engine restarting, storage briefly down, a
dropped connection). A deterministic error (bad input, a plug-in that does not import,
a missing file, too many failed samples) fails the same way again, and so does a call to
a process of the run that is gone for good: retrying only delays the run's end and
repeats the message.
"""

from __future__ import annotations


class Unrecoverable(RuntimeError):
    """A failure of the run's own long-lived state (a trainer rank's process gone): no retry
    can bring it back, only a new run that resumes from the last checkpoint."""


DETERMINISTIC: tuple[type[BaseException], ...] = (
    ValueError,  # bad config or data (pydantic's ValidationError is one), too many failed samples
    TypeError,
    LookupError,
    ImportError,
    AttributeError,
    NotImplementedError,
    AssertionError,
    FileNotFoundError,
    PermissionError,
    IsADirectoryError,
    NotADirectoryError,
    Unrecoverable,
)


def is_deterministic(exc: BaseException | None) -> bool:
    """True when `exc` (or the error a Ray task re-raised it for) would repeat on a retry."""
    seen = 0
    while exc is not None and seen < 8:
        if isinstance(exc, DETERMINISTIC):
            return True
        # Ray re-raises an actor's error as RayTaskError; where it cannot also subclass the
        # original type, the original sits in `.cause`.
        exc = getattr(exc, "cause", None)
        seen += 1
    return False
