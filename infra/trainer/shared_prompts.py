"""One forward per prompt for the samples that share it: a GRPO group's n responses packed
behind one copy of their prompt.

A micro-batch row normally holds one sample, prompt then response, so a group of n
samples runs its prompt through the model n times. Packed, a row holds a prompt once and
then each of its responses; an attention mask lets every response see the prompt and its
own earlier tokens only, and position ids restart after the prompt for each response, so
each response token gets the same logits as in its own row (up to float rounding). The
packed logits are then laid out as the per-sample rows would have had them, so the loss,
its metrics and the gradients downstream are unchanged.

Packing pays when the prompt is a large part of each row (short answers, or many samples
of each prompt). It needs a dense attention mask (a packed row's length squared), and
attention kernels take such a mask more slowly than a plain causal one, so a micro-batch is
packed only where that cuts its padded tokens by a quarter or more, in rows of at most
`MAX_WIDTH` tokens. `algorithm.shared_prompt_forward` turns it off.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from infra.rollout.batch import Sample

MAX_SHARE = 0.75  # packed only at this share of the unpacked padded tokens or less
MAX_WIDTH = 2048  # a packed row's tokens: its dense mask holds this squared


@dataclass
class SharedPrompts:
    input_ids: torch.Tensor  # [G, L] each distinct prompt, then every response to it
    position_ids: torch.Tensor  # [G, L] a response's tokens count on from its prompt's end
    attention_mask: torch.Tensor  # [G, 1, L, L] True where a query may attend a key
    gather: torch.Tensor  # [B, T-1] per sample row and position: the packed logit to take


def _chunks(
    groups: dict[tuple[int, ...], list[int]], per_row: int
) -> list[tuple[tuple[int, ...], list[int]]]:
    """Each prompt with the rows of its samples, at most `per_row` responses a packed row."""
    return [
        (prompt, rows[i : i + per_row])
        for prompt, rows in groups.items()
        for i in range(0, len(rows), per_row)
    ]


def _width(samples: list[Sample], chunks: list[tuple[tuple[int, ...], list[int]]]) -> int:
    return max(len(prompt) + sum(len(samples[r].response_ids) for r in rows) for prompt, rows in chunks)


def pack_shared(samples: list[Sample], length: int, device: torch.device) -> SharedPrompts | None:
    """The packed layout of `samples` (rows of `length` tokens when unpacked), or None when
    packing would not cut the padded tokens to `MAX_SHARE` of the unpacked ones.

    A prompt's samples fill packed rows of up to 2, 4, 8, ... responses, whichever count
    computes the fewest padded tokens in rows of at most `MAX_WIDTH` tokens."""
    if any(len(s.prompt_ids) == 0 for s in samples):
        return None
    groups: dict[tuple[int, ...], list[int]] = {}
    for row, s in enumerate(samples):
        groups.setdefault(tuple(s.prompt_ids), []).append(row)
    best, chunks, packed_len = MAX_SHARE * len(samples) * length, None, 0
    per_row = 2
    while per_row <= len(samples):
        candidate = _chunks(groups, per_row)
        width = _width(samples, candidate)
        if width > MAX_WIDTH:
            break  # rows only grow with more responses each
        if len(candidate) * width < best:
            best, chunks, packed_len = len(candidate) * width, candidate, width
        per_row *= 2
    if chunks is None:
        return None
    # built as lists and turned into tensors once: a tensor op per sample costs more than
    # the forward it saves at the demo's shape
    ids, positions, segment = [], [], []  # segment: -1 pad, 0 prompt, k the k-th response
    gather = [[]] * len(samples)
    for g, (prompt, rows) in enumerate(chunks):
        p, base = len(prompt), g * packed_len
        row_ids, row_pos, row_seg = list(prompt), list(range(p)), [0] * p
        # a sample row's logit t predicts its token t + 1: the prompt's own logits up to the
        # prompt's last (which predicts every response's first token), then the response's;
        # positions past the sample's end (padding, masked out) read the prompt's last too
        head = list(range(base, base + p))
        for k, row in enumerate(rows, start=1):
            response = samples[row].response_ids
            start, r = len(row_ids), len(response)
            row_ids += response
            row_pos += range(p, p + r)
            row_seg += [k] * r
            own = list(range(base + start, base + start + r - 1))
            gather[row] = (head + own + [base + p - 1] * length)[: length - 1]
        pad = packed_len - len(row_ids)
        ids.append(row_ids + [0] * pad)
        positions.append(row_pos + [0] * pad)
        segment.append(row_seg + [-1] * pad)
    segment_t = torch.tensor(segment)
    causal = torch.ones(packed_len, packed_len, dtype=torch.bool).tril()
    q, k = segment_t[:, :, None], segment_t[:, None, :]
    sees = ((k == 0) & (q >= 0)) | ((k == q) & (q > 0))  # the prompt, and one's own response
    mask = (sees & causal) | torch.eye(packed_len, dtype=torch.bool)  # a pad sees itself: no NaN
    return SharedPrompts(
        torch.tensor(ids).to(device),
        torch.tensor(positions).to(device),
        mask[:, None].to(device),
        torch.tensor(gather).to(device),
    )


def shared_logits(model: nn.Module, shared: SharedPrompts) -> torch.Tensor:
    """[B, T-1, V]: the packed forward's logits in the per-sample rows' layout."""
    logits = model(
        input_ids=shared.input_ids,
        attention_mask=shared.attention_mask,
        position_ids=shared.position_ids,
        use_cache=False,
    ).logits
    return logits.flatten(0, 1)[shared.gather]
