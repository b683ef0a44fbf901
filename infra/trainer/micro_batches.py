"""Which samples each rank trains on in each micro-batch: by sample count or by token budget.

A plan is, per optimizer step, per rank, a list of micro-batches, each a list of sample
indices. Every rank computes the whole plan from the same samples (no communication) and
takes its own part. Every rank gets the same number of micro-batches in a step, because
each forward/backward runs FSDP collectives that must pair up across ranks.

The token budget (verl's `use_dynamic_bsz` + `ppo_max_token_len_per_gpu`) counts padded
tokens, rows x longest row, since that is what a right-padded forward computes. Samples
of a step are sorted by length and dealt to the ranks in snake order (equal sample counts,
near-equal tokens), then packed greedily, longest first, so rows of similar length share a
micro-batch and little is padding. The loss is unchanged by any split: its aggregation
weights use the token and sequence counts of the whole step (`aggregation_weights`).
"""

from __future__ import annotations

Plan = list[list[list[list[int]]]]  # step -> rank -> micro-batch -> sample indices


def padded_length(prompt_len: int, response_len: int) -> int:
    """Row length of a sample in a micro-batch (`collate` pads to at least 2)."""
    return max(2, prompt_len + response_len)


def plan_by_count(num_samples: int, world_size: int, global_batch_size: int, micro_batch_size: int) -> Plan:
    per_rank = global_batch_size // world_size
    plan: Plan = []
    for start in range(0, num_samples, global_batch_size):
        ranks = []
        for rank in range(world_size):
            first = start + rank * per_rank
            mine = list(range(first, first + per_rank))
            ranks.append([mine[i : i + micro_batch_size] for i in range(0, per_rank, micro_batch_size)])
        plan.append(ranks)
    return plan


def _deal(order: list[int], world_size: int) -> list[list[int]]:
    """Snake order (0,1,..,w-1,w-1,..,0,...): rank loads stay close when `order` is sorted."""
    ranks: list[list[int]] = [[] for _ in range(world_size)]
    for pos, i in enumerate(order):
        turn, r = divmod(pos, world_size)
        ranks[r if turn % 2 == 0 else world_size - 1 - r].append(i)
    return ranks


def _pack(indices: list[int], lengths: list[int], budget: int) -> list[list[int]]:
    """Greedy, longest first: a row joins the current micro-batch while rows x longest <= budget.
    A row longer than the budget on its own gets a micro-batch of its own."""
    batches: list[list[int]] = []
    for i in indices:  # sorted longest first, so the first row of a batch is its longest
        if batches and (len(batches[-1]) + 1) * lengths[batches[-1][0]] <= budget:
            batches[-1].append(i)
        else:
            batches.append([i])
    return batches


def _split_to(batches: list[list[int]], count: int) -> list[list[int]]:
    """Halve the largest micro-batches until there are `count` (always possible: count <= rows)."""
    batches = [list(b) for b in batches]
    while len(batches) < count:
        k = max(range(len(batches)), key=lambda j: len(batches[j]))
        half = len(batches[k]) // 2
        batches[k : k + 1] = [batches[k][:half], batches[k][half:]]
    return batches


def plan_by_tokens(lengths: list[int], world_size: int, global_batch_size: int, budget: int) -> Plan:
    plan: Plan = []
    for start in range(0, len(lengths), global_batch_size):
        step = range(start, start + global_batch_size)
        order = sorted(step, key=lambda i: (-lengths[i], i))
        packed = [_pack(mine, lengths, budget) for mine in _deal(order, world_size)]
        count = max(len(b) for b in packed)
        plan.append([_split_to(b, count) for b in packed])
    return plan
