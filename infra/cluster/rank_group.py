"""A group of ranks (the trainer's, the critic's) called together: one call per rank, the
results in rank order, rank 0's answer where one rank speaks for the group.

Waiting on one call per rank must not hang on a dead one.

`ray.get` over all ranks' refs blocks on the first ref in the list: when rank 1 dies, rank
0 may sit in a collective waiting for it (until the process group's timeout), so the
death would surface only then, and as an error that names no rank. Waiting on whichever
ref finishes first surfaces a dead rank at once, with its number.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import ray
from ray.exceptions import ActorDiedError, ActorUnavailableError, RayActorError

from infra.errors import Unrecoverable


class TrainerRankDied(Unrecoverable):
    """A trainer rank's process died; the flow cannot continue (a resume can). Ray does not
    restart trainer ranks, so a Prefect retry would only call the dead rank again."""


class RankGroup(Sequence):
    """The actors of one FSDP group, in rank order. Every fan-out over a group goes through
    `call` (or `refs`, where the caller waits its own way), so a dead rank is named the
    same way everywhere."""

    def __init__(self, ranks: Iterable[Any], role: str = "trainer") -> None:
        self.ranks = list(ranks)
        self.role = role

    def __len__(self) -> int:
        return len(self.ranks)

    def __getitem__(self, index):  # noqa: ANN001, ANN204 - Sequence's int and slice forms
        return self.ranks[index]

    def __repr__(self) -> str:
        return f"RankGroup({self.role}, {len(self.ranks)} ranks)"

    def refs(self, method: str, *args: Any, **kwargs: Any) -> list:
        """Start `method` on every rank; its refs in rank order."""
        return [getattr(rank, method).remote(*args, **kwargs) for rank in self.ranks]

    def call(self, method: str, *args: Any, what: str | None = None, **kwargs: Any) -> list:
        """`method` on every rank, waited for: the results in rank order. A rank that dies
        raises `TrainerRankDied` naming it at once, not when a collective times out."""
        return get_ranks(self.refs(method, *args, **kwargs), what or method, self.role)

    def rank0(self, method: str, *args: Any, what: str | None = None, **kwargs: Any) -> Any:
        """`method` on every rank (they take part in the same collectives); rank 0's answer
        speaks for the group."""
        return self.call(method, *args, what=what, **kwargs)[0]


def get_ranks(refs: list, what: str, role: str = "trainer") -> list:
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
            raise TrainerRankDied(f"{role} rank {r} died during {what}: {_first_line(exc)}") from exc
        except Exception:
            # a live rank's collective failed ("connection closed by peer"): if that is
            # because another rank died, name the dead rank rather than the symptom
            _raise_if_died(pending, index, what, role, GRACE_S)
            raise
    return [results[r] for r in range(len(refs))]


GRACE_S = 5.0


def _raise_if_died(pending: list, index: dict, what: str, role: str, timeout_s: float) -> None:
    done, _ = ray.wait(pending, num_returns=len(pending), timeout=timeout_s) if pending else ([], [])
    for ref in done:
        try:
            ray.get(ref)
        except (ActorDiedError, ActorUnavailableError, RayActorError) as exc:
            raise TrainerRankDied(f"{role} rank {index[ref]} died during {what}: {_first_line(exc)}") from exc
        except Exception:  # noqa: BLE001, S112 - another symptom; keep looking for a death
            continue


def _first_line(exc: BaseException) -> str:
    # Ray's message goes on for lines about OOM killers; the cause stays chained
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
