"""cluster.fsdp_gather on 2 gloo ranks (spawned processes) with the tiny model: with
`per_step` a pass over micro-batches all-gathers each FSDP unit once and reduce-scatters
once, keeps the weights gathered in between, and leaves the model sharded as FSDP2 left it;
the gradients equal FSDP2's own per-micro-batch ones."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from tests.dist.ranks import spawn_ranks
from tests.ports import free_port

pytestmark = pytest.mark.dist
ADDR = "127.0.0.1"
MICRO_BATCHES = 4


def _counting(name: str, counts: dict) -> None:
    # FSDP2 calls its collectives as attributes of torch.distributed (_fsdp_collectives)
    real = getattr(dist, name)

    def counted(*args, **kwargs):
        counts[name] += 1
        return real(*args, **kwargs)

    setattr(dist, name, counted)


def _worker(rank: int, port: int, model_dir: str, out: str, gather: str) -> None:
    from torch.distributed.fsdp import FSDPModule
    from torch.distributed.tensor import DTensor
    from transformers import AutoModelForCausalLM

    from infra.trainer.parallelize import init_distributed, micro_batches, parallelize

    torch.set_num_threads(1)
    init_distributed(rank, 2, ADDR, port)
    model = parallelize(AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32), 2, gather)
    q_proj = model.model.layers[0].self_attn.q_proj  # its .weight read anew: FSDP swaps the tensor
    g = torch.Generator().manual_seed(rank)
    batches = [torch.randint(4, 30, (3, 7), generator=g) for _ in range(MICRO_BATCHES)]
    counts = {"all_gather_single": 0, "reduce_scatter_single": 0}
    _counting("all_gather_single", counts)
    _counting("reduce_scatter_single", counts)
    seen = {}
    with micro_batches(model) as fsdp:
        with torch.no_grad():  # as the old-logprob pass
            for ids in batches:
                model(input_ids=ids, use_cache=False)
        seen["gathered_after_no_grad_pass"] = not isinstance(q_proj.weight, DTensor)
        for i, ids in enumerate(batches):
            loss = model(input_ids=ids, use_cache=False).logits.float().pow(2).mean()
            fsdp.before_backward(last=i == MICRO_BATCHES - 1)
            loss.backward()
            if i == 0:
                seen["gathered_after_first_backward"] = not isinstance(q_proj.weight, DTensor)
    params = list(model.parameters())
    seen["sharded_after"] = all(isinstance(p, DTensor) for p in params)
    seen["grads_sharded"] = all(isinstance(p.grad, DTensor) for p in params)
    seen["units"] = sum(isinstance(m, FSDPModule) for m in model.modules())
    seen["counts"] = dict(counts)
    grads = {n: p.grad.full_tensor() for n, p in model.named_parameters()}
    # a second pass behaves as the first: the settings were put back
    counts.update({k: 0 for k in counts})
    with micro_batches(model) as fsdp:
        loss = model(input_ids=batches[0], use_cache=False).logits.float().pow(2).mean()
        fsdp.before_backward(last=True)
        loss.backward()
    seen["counts_one_micro_batch"] = dict(counts)
    if rank == 0:
        torch.save({"seen": seen, "grads": grads}, f"{out}/{gather}.pt")


@pytest.fixture(scope="module")
def runs(model_dir, tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("gather")
    for gather in ("per_step", "per_micro_batch"):
        spawn_ranks(_worker, free_port(), str(model_dir), str(out), gather)
    return {g: torch.load(out / f"{g}.pt") for g in ("per_step", "per_micro_batch")}


def test_per_step_gathers_and_reduces_each_unit_once(runs):
    seen = runs["per_step"]["seen"]
    units = seen["units"]
    assert units == 3  # two decoder layers and the root
    # the no-grad pass, the micro-batches' forwards and backwards: one all-gather per unit
    assert seen["counts"] == {"all_gather_single": units, "reduce_scatter_single": units}
    assert seen["gathered_after_no_grad_pass"] and seen["gathered_after_first_backward"]
    assert seen["sharded_after"] and seen["grads_sharded"]
    assert seen["counts_one_micro_batch"] == {"all_gather_single": units, "reduce_scatter_single": units}


def test_per_micro_batch_is_fsdp2s_default(runs):
    seen = runs["per_micro_batch"]["seen"]
    units = seen["units"]
    assert seen["counts"]["reduce_scatter_single"] == MICRO_BATCHES * units
    # decoder layers gather for every forward (4 no-grad, 4 with grad) and again for every backward
    assert seen["counts"]["all_gather_single"] >= 3 * MICRO_BATCHES * (units - 1)
    assert not seen["gathered_after_no_grad_pass"] and not seen["gathered_after_first_backward"]
    assert seen["sharded_after"] and seen["grads_sharded"]


def test_both_give_the_same_gradients(runs):
    a, b = runs["per_step"]["grads"], runs["per_micro_batch"]["grads"]
    assert a.keys() == b.keys()
    for name in a:
        torch.testing.assert_close(a[name], b[name], atol=1e-6, rtol=1e-5, msg=name)
    assert any(g.abs().sum() > 0 for g in a.values())
