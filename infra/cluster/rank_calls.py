"""Waiting on one call per trainer rank without hanging on a dead one.

`ray.get` over all ranks' refs blocks on the first ref in the list: when rank 1 dies, rank
0 may sit in a collective waiting for it (until the process group's timeout), so the
death would surface only then, and as an error that names no rank. Waiting on whichever
ref finishes first surfaces a dead rank at once, with its number.
"""

from __future__ import annotations

import ray
from ray.exceptions import ActorDiedError, ActorUnavailableError, RayActorError

from infra.errors import Unrecoverable


class TrainerRankDied(Unrecoverable):
    """A trainer rank's process died; the flow cannot continue (a resume can). Ray does not
    restart trainer ranks, so a Prefect retry would only call the dead rank again."""


def get_ranks(refs: list, what: str) -> list:
    """The results of one call per rank, in rank order; the first failure raises at once."""
    index = {ref: r for r, ref in enumerate(refs)}
    results: dict[int, object] = {}
    pending = list(refs)
    while pending:
        done, pending = ray.wait(pending, num_returns=1)
        r = index[done[0]]
        try:
            results[r] = ray.get(done[0])
        except (ActorDiedError, ActorUnavailableError, RayActorError) as exc:
            raise TrainerRankDied(f"trainer rank {r} died during {what}: {_first_line(exc)}") from exc
        except Exception:
            # a live rank's collective failed ("connection closed by peer"): if that is
            # because another rank died, name the dead rank rather than the symptom
            _raise_if_died(pending, index, what, GRACE_S)
            raise
    return [results[r] for r in range(len(refs))]


GRACE_S = 5.0


def _raise_if_died(pending: list, index: dict, what: str, timeout_s: float) -> None:
    done, _ = ray.wait(pending, num_returns=len(pending), timeout=timeout_s) if pending else ([], [])
    for ref in done:
        try:
            ray.get(ref)
        except (ActorDiedError, ActorUnavailableError, RayActorError) as exc:
            raise TrainerRankDied(
                f"trainer rank {index[ref]} died during {what}: {_first_line(exc)}"
            ) from exc
        except Exception:  # noqa: BLE001, S112 - another symptom; keep looking for a death
            continue


def _first_line(exc: BaseException) -> str:
    # Ray's message goes on for lines about OOM killers; the cause stays chained
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
