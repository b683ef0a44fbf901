"""What the dist tests compare between ranks, saves and loads: an FSDP rank's whole training
state (actor or critic), unsharded on CPU."""

from __future__ import annotations


def full_train_state(rank) -> dict:
    """Model, optimizer and LR schedule of a `FSDPRank`; every rank must call it (gathers)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    model_sd, optim_sd = get_state_dict(rank.model, rank.optimizer, options=options)
    return {"model": model_sd, "optim": optim_sd, "scheduler": rank.scheduler.state_dict()}
