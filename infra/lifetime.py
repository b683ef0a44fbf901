"""Child processes that die with the process that started them."""

from __future__ import annotations

import ctypes
import signal
import sys
from collections.abc import Callable

_PR_SET_PDEATHSIG = 1


def die_with_parent(sig: signal.Signals = signal.SIGKILL) -> Callable[[], None] | None:
    """A `preexec_fn` for `subprocess.Popen`: the child gets `sig` when its parent dies, even by
    SIGKILL, when no cleanup code of the parent runs (Linux; None elsewhere).

    The signal fires when the launching *thread* exits: launch from a thread that lives as
    long as the child should (the main one). libc is loaded here, in the parent, so the
    child runs no loader code between fork and exec (a lock another thread held at the fork
    would never be released there).
    """
    if not sys.platform.startswith("linux"):
        return None
    prctl = ctypes.CDLL("libc.so.6", use_errno=True).prctl

    def set_death_signal() -> None:
        prctl(_PR_SET_PDEATHSIG, int(sig))

    return set_death_signal
