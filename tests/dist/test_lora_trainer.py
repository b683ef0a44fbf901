"""A LoRA adapter trained by the real FSDP2 trainer ranks (2 gloo ranks, and 1 process):
only the adapter trains, the sharded run equals the one-process run, a resume from the
adapter checkpoint continues exactly, the weights a push sends are the merged ones, and the
PEFT export loads with peft and gives the trainer's logprobs."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from torch.distributed.checkpoint import FileSystemReader

from infra.config import RunConfig
from infra.model.lora import is_adapter_param
from tests.dist.rank_state import full_train_state
from tests.dist.test_fsdp_trainer import ADDR, _assert_equal_tree, _batch, _spawn
from tests.ports import free_port

pytestmark = pytest.mark.dist
INPUT = torch.tensor([[5, 17, 42, 8, 99, 23], [7, 7, 60, 61, 62, 3]])
LORA = {"r": 4, "alpha": 8, "target_modules": ["q_proj", "v_proj", "down_proj"]}


def _cfg(world_size: int) -> RunConfig:
    return RunConfig(
        rollout={"prompts_per_rollout": 2, "n_samples_per_prompt": 4, "sampling": {"temperature": 0.7}},
        algorithm={"micro_batch_size": 2, "lr": 0.05, "kl_coef": 0.1},
        cluster={"trainer": {"num_workers": world_size}},
        model={"lora": LORA},
    )


def _full(model) -> dict[str, torch.Tensor]:
    from torch.distributed.tensor import DTensor

    return {
        n: (p.full_tensor() if isinstance(p, DTensor) else p).detach().clone()
        for n, p in model.named_parameters()
    }


def _trainer(rank: int, world_size: int, port: int, model_dir: str):
    from infra.trainer.rank import TrainerRank

    torch.set_num_threads(1)
    trainer = TrainerRank(_cfg(world_size), rank, world_size)
    trainer.setup(model_dir, {}, ADDR, port)
    return trainer


def _train_worker(rank: int, world_size: int, port: int, model_dir: str, runs: str) -> None:
    from infra.trainer.lora_merge import merged_params

    out = f"{runs}/w{world_size}"

    trainer = _trainer(rank, world_size, port, model_dir)
    before = _full(trainer.model)
    metrics = [trainer.train(0, _batch(0)), trainer.train(1, _batch(1))]
    after = _full(trainer.model)
    trainer.save_checkpoint(f"{out}/ckpt", {})
    saved = full_train_state(trainer)
    with merged_params(trainer.model) as params:  # what a push sends
        pushed = _full_dict(params)
    restored = _full(trainer.model)
    trainer.export_hf(f"{out}/adapter", {})
    trainer.export_hf(f"{out}/merged", {}, merged=True)
    with torch.no_grad():
        logprobs = trainer.model(input_ids=INPUT).logits.log_softmax(-1)  # a collective: all ranks
    next_metrics = trainer.train(2, _batch(2))
    state = {
        "before": before,
        "after": after,
        "restored": restored,
        "pushed": pushed,
        "metrics": metrics,
        "saved": saved,
        "logprobs": logprobs,
        "next": full_train_state(trainer),
        "next_metrics": next_metrics,
        "trained": sorted(n for n, p in trainer.model.named_parameters() if p.requires_grad),
        "optim_params": sum(len(g["params"]) for g in trainer.optimizer.param_groups),
    }
    if rank == 0:
        torch.save(state, f"{runs}/w{world_size}.pt")
    trainer.shutdown()


def _full_dict(params: dict) -> dict[str, torch.Tensor]:
    from torch.distributed.tensor import DTensor

    return {n: (p.full_tensor() if isinstance(p, DTensor) else p).detach().clone() for n, p in params.items()}


def _resume_worker(rank: int, port: int, model_dir: str, out: str) -> None:
    trainer = _trainer(rank, 2, port, model_dir)
    trainer.load_checkpoint(f"{out}/w2/ckpt", {})
    loaded = full_train_state(trainer)
    next_metrics = trainer.train(2, _batch(2))
    state = {"loaded": loaded, "next": full_train_state(trainer), "next_metrics": next_metrics}
    if rank == 0:  # every rank gathered it; rank 0 writes
        torch.save(state, f"{out}/r.pt")
    trainer.shutdown()


@pytest.fixture(scope="module")
def runs(model_dir, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("lora")
    _spawn(_train_worker, 2, 2, free_port(), str(model_dir), str(out))
    _spawn(_train_worker, 1, 1, free_port(), str(model_dir), str(out))
    return out


def test_only_the_adapter_trains(runs):
    got = torch.load(runs / "w2.pt")
    assert got["trained"] and all(is_adapter_param(n) for n in got["trained"])
    # q, v and down projections of each of the 2 layers, A and B each
    assert len(got["trained"]) == 2 * 3 * 2 == got["optim_params"]
    changed = {n for n in got["after"] if not torch.equal(got["before"][n], got["after"][n])}
    assert changed == set(got["trained"])  # every adapter tensor moved, nothing else did
    assert all(got["metrics"][i]["grad_norm"] > 0 for i in range(2))
    # the checkpoint holds the adapter and its optimizer state, not the frozen base
    stored = FileSystemReader(str(runs / "w2" / "ckpt")).read_metadata().state_dict_metadata
    assert {k.removeprefix("model.") for k in stored if k.startswith("model.")} == set(got["trained"])
    moments = {k.removeprefix("optim.state.") for k in stored if k.startswith("optim.state.")}
    assert moments == {f"{n}.{m}" for n in got["trained"] for m in ("exp_avg", "exp_avg_sq", "step")}
    assert len(got["saved"]["optim"]["state"]) == len(got["trained"])


def test_two_ranks_equal_one_process(runs):
    two, one = torch.load(runs / "w2.pt"), torch.load(runs / "w1.pt")
    for step in range(2):
        for key in ("loss", "grad_norm", "kl", "entropy"):
            assert two["metrics"][step][key] == pytest.approx(one["metrics"][step][key], abs=1e-6), key
    # Adam divides by the gradient's own scale: where a gradient is near zero (lora_A's is
    # exactly zero at the first step, B starting at zero), the last-bit differences of the
    # ranks' reduction order become differences of ~1e-5 in the step; 1e-4 is 0.1% of lr
    for name in two["trained"]:
        torch.testing.assert_close(two["after"][name], one["after"][name], atol=1e-4, rtol=0, msg=name)


def test_resume_from_the_adapter_checkpoint_is_identical(runs, model_dir):
    _spawn(_resume_worker, 2, free_port(), str(model_dir), str(runs))
    first, resumed = torch.load(runs / "w2.pt"), torch.load(runs / "r.pt")
    _assert_equal_tree(first["saved"], resumed["loaded"])
    _assert_equal_tree(first["next"], resumed["next"])
    assert first["next_metrics"]["loss"] == resumed["next_metrics"]["loss"]


def test_push_sends_merged_weights_and_leaves_the_base_as_it_was(runs):
    got = torch.load(runs / "w2.pt")
    merged = load_file(runs / "w2" / "merged" / "model.safetensors")
    assert got["pushed"].keys() == merged.keys()  # the base model's names, no adapter tensors
    for name, tensor in merged.items():
        torch.testing.assert_close(got["pushed"][name], tensor, atol=1e-6, rtol=0, msg=name)
    adapted = [n for n in merged if any(f"{m}.weight" in n for m in LORA["target_modules"])]
    base = {n.replace(".base_layer", "").removeprefix("base_model.model."): t for n, t in got["after"].items()}
    assert len(adapted) == 6 and all(not torch.equal(merged[n], base[n]) for n in adapted)
    # the merge was undone exactly: the frozen weights are bit for bit what they were
    _assert_equal_tree(got["after"], got["restored"])


def test_peft_export_loads_with_the_trainers_logprobs(runs, model_dir):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    got = torch.load(runs / "w2.pt")
    adapter = runs / "w2" / "adapter"
    assert {p.name for p in adapter.iterdir()} >= {"adapter_config.json", "adapter_model.safetensors"}
    base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model = PeftModel.from_pretrained(base, adapter).eval()
    merged = AutoModelForCausalLM.from_pretrained(runs / "w2" / "merged", dtype=torch.float32).eval()
    with torch.no_grad():
        peft_logprobs = model(input_ids=INPUT).logits.log_softmax(-1)
        merged_logprobs = merged(input_ids=INPUT).logits.log_softmax(-1)
    assert (peft_logprobs - got["logprobs"]).abs().max() < 1e-5
    assert (merged_logprobs - got["logprobs"]).abs().max() < 1e-5
    plain = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        assert (plain(input_ids=INPUT).logits.log_softmax(-1) - got["logprobs"]).abs().max() > 1e-3
