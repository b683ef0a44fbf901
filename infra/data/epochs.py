"""Where a batch falls in the prompt stream's epochs (the prompt source and the loop's
schedule both ask)."""

from __future__ import annotations


def batch_ends_epoch(rollout_id: int, batch_size: int, num_prompts: int) -> bool:
    """True when batch `rollout_id` (stream positions k*B .. (k+1)*B-1 over `num_prompts`
    rows per epoch) holds the last prompt of an epoch: it reaches or crosses an epoch's end."""
    return (rollout_id + 1) * batch_size // num_prompts > rollout_id * batch_size // num_prompts
