"""The run's actors, started by `python -m flows.train` while the Prefect API server boots.

From a shell, the command starts the API server and Ray itself; until the server answers
and the flow run exists, the machine would wait half idle (`python -m bench.startup`). So
once Ray is up, the command runs the preflight and, if it passes, starts the run's
`RLSystem` in a thread; the flow then takes that system instead of starting one. The flow
still owns it: its task runs, logs and the system's end are the same as when it starts the
system itself, as a deployment's run does (no early start there: its worker calls the flow
function directly).

A preflight that fails starts nothing: the flow runs the preflight itself and fails with its
message in the UI.
"""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor, wait
from typing import TYPE_CHECKING

from infra import startup
from infra.config import RunConfig
from infra.preflight import Preflight, preflight

if TYPE_CHECKING:
    from infra.handles import RunHandles
    from infra.system import RLSystem

log = logging.getLogger(__name__)


class EarlyStart:
    """The preflight's result and the run's system, starting in a thread of its own."""

    def __init__(self, config: RunConfig, checked: Preflight, system: RLSystem) -> None:
        self.config, self.checked, self.system = config, checked, system
        self.taken = False  # the flow run asked for it
        self.handed = False  # and got its handles: from then on the flow stops it
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="early-start")
        self._starting = self._pool.submit(system.start)

    @property
    def placement(self) -> dict[str, list[str]]:
        return self.system.placement

    @property
    def pids(self) -> dict[str, list]:
        return self.system.pids

    def __enter__(self) -> RunHandles:
        """The flow takes the system: its handles once started (or the start's error)."""
        self.taken = True
        try:
            handles = self._starting.result()
        except BaseException:
            self.system.dispose()
            raise
        self.handed = True
        return handles

    def __exit__(self, *exc) -> None:
        self.system.dispose()

    def close(self) -> None:
        """The command's cleanup of a system the flow run never got (it failed before, or was
        interrupted while the system started). Stopped at once: a start still running fails
        at its next wait on an actor, instead of waiting out the engines' start-up timeout;
        what it made before it stopped goes with a second stop."""
        if not self.handed:
            self.system.dispose()
        wait([self._starting])
        if not self.handed:
            self.system.dispose()
        self._pool.shutdown()


_pending: EarlyStart | None = None


def begin(config: RunConfig, system: RLSystem) -> EarlyStart | None:
    """Preflight `config` and start `system` for the flow run about to begin; None (nothing
    started) when the preflight fails or finds nothing to do."""
    global _pending
    try:
        checked = preflight(config)
    except Exception as e:  # noqa: BLE001 - the flow's own preflight raises it where the UI shows it
        log.info("preflight failed before the flow run (the flow run reports it): %s", e)
        return None
    startup.mark("preflight")
    if checked.finished:
        return None
    _pending = EarlyStart(config, checked, system)
    return _pending


def end(early: EarlyStart | None) -> None:
    """Undo `begin`: whatever the flow did not take is stopped."""
    global _pending
    _pending = None
    if early is not None:
        early.close()


def pending(config: RunConfig) -> EarlyStart | None:
    """The early start for a flow run of `config`, if the command began one for that config."""
    return _pending if _pending is not None and _pending.config == config and not _pending.taken else None


def preflight_of(config: RunConfig) -> Preflight:
    """The run's preflight: the early start's, or one run now."""
    early = pending(config)
    return early.checked if early is not None else preflight(config)
