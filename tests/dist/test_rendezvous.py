"""Rank 0 binds its rendezvous port before anyone is told it: the trainer group's master
port and the weight-update group's store. Each test checks, at the moment the port is
handed out, that it already accepts connections and that no one else can bind it; then
the group forms on it and carries a collective."""

from __future__ import annotations

import errno
import socket

import pytest
import torch
import torch.multiprocessing as mp

from infra.config import RunConfig
from tests.dist.ranks import spawn_ranks

pytestmark = pytest.mark.dist
ADDR = "127.0.0.1"


def _held(port: int) -> dict[str, bool]:
    """Whether `port` accepts a connection, and whether another bind of it is refused."""
    with socket.create_connection((ADDR, port), timeout=5):
        listening = True
    with socket.socket() as other:
        try:
            other.bind((ADDR, port))
            taken = False
        except OSError as e:
            taken = e.errno == errno.EADDRINUSE
    return {"listening": listening, "taken": taken}


def _trainer_rank(rank: int, ports, results) -> None:
    import torch.distributed as dist

    from infra.trainer.fsdp_rank import FSDPRank

    member = FSDPRank(RunConfig(), rank, 2)
    if rank == 0:
        addr, port = member.master_address()
        results.put(("held", _held(port)))
        ports.put((addr, port))
    else:
        addr, port = ports.get(timeout=60)
    member._join(addr, port)
    total = torch.tensor([rank + 1.0])
    dist.all_reduce(total)
    results.put((rank, total.item()))
    results.close()
    results.join_thread()  # the rank leaves by os._exit: the queue's feeder thread first


def test_trainer_master_port_is_bound_before_the_ranks_are_told():
    ctx = mp.get_context("spawn")
    ports, results = ctx.Queue(), ctx.Queue()
    spawn_ranks(_trainer_rank, ports, results)
    got = dict(results.get(timeout=5) for _ in range(3))
    assert got["held"] == {"listening": True, "taken": True}
    assert got[0] == got[1] == 3.0  # the group formed on that port


class _TellingEngine:
    """Stands in for an engine's client: when told where the group meets, records whether
    the port is already held, then lets the engine process join."""

    url = "fake://engine"

    def __init__(self, joins) -> None:
        self.joins, self.held = joins, None

    def init_weights_update_group(self, address, port, rank_offset, world_size, group_name, backend):
        self.held = _held(port)
        self.joins.put((address, port, rank_offset, world_size, group_name, backend))


def _engine(joins, results) -> None:
    from infra.weights.group import broadcast, close_update_group, open_update_group

    address, port, rank, world_size, group_name, backend = joins.get(timeout=60)
    group = open_update_group(address, port, rank, world_size, group_name=group_name, backend=backend)
    received = torch.zeros(4)
    broadcast(group, received, src=0)
    results.put(received.tolist())
    close_update_group(group)


def test_weight_group_store_is_bound_before_the_engines_are_told():
    from infra.weights.broadcast import BroadcastSender
    from infra.weights.engines import EngineLink
    from infra.weights.group import broadcast

    ctx = mp.get_context("spawn")
    joins, results = ctx.Queue(), ctx.Queue()
    engine = ctx.Process(target=_engine, args=(joins, results))
    engine.start()
    try:
        client = _TellingEngine(joins)
        sender = BroadcastSender([EngineLink(client, 1, 1, torch.float32)], "bind-first", timeout_s=60)
        sender.open(ADDR, 0, "gloo")
        assert client.held == {"listening": True, "taken": True}
        broadcast(sender.group, torch.arange(4.0), src=0)
        assert results.get(timeout=60) == [0.0, 1.0, 2.0, 3.0]
    finally:
        engine.join(timeout=60)
        if engine.is_alive():
            engine.kill()
    assert engine.exitcode == 0
