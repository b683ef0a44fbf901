"""A test's function run on N spawned ranks, each leaving without the interpreter's exit.

A process-group test could pass and still fail: its rank aborted with SIGABRT ("terminate
called without an active exception") after its work was done, at interpreter exit, where
the static destructors of gloo's and the TCPStore's C++ threads run, more often on a loaded
machine. A rank here finishes in step with the others (a barrier, so that no rank's exit
closes a connection another is still using), destroys its process group and leaves with
`os._exit`, which runs no static destructor. An exception in the function still fails the
rank, with its traceback, as `torch.multiprocessing` reports it.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable

import torch.distributed as dist
import torch.multiprocessing as mp


def _rank_main(rank: int, fn: Callable, args: tuple) -> None:
    fn(rank, *args)
    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def spawn_ranks(fn: Callable, *args, nprocs: int = 2) -> None:
    """Run `fn(rank, *args)` on `nprocs` spawned processes; raises if any rank fails."""
    mp.start_processes(_rank_main, args=(fn, args), nprocs=nprocs, start_method="spawn", join=True)
