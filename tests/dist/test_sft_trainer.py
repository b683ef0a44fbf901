"""SFT on 2 FSDP2 gloo ranks (spawned processes, `TrainerRank.setup_sft` / `sft_epoch`)
takes the same steps as one process on the whole batch."""

from __future__ import annotations

import pytest
import torch

from infra.config import RunConfig
from tests.dist.ranks import spawn_ranks
from tests.ports import free_port

pytestmark = pytest.mark.dist
ADDR = "127.0.0.1"
EPOCHS = 2


def _cfg(micro_batch_size: int) -> RunConfig:
    return RunConfig(
        data={"train_path": "builtin:addition"},  # 80 labelled rows: 5 steps of 16 an epoch
        sft={"batch_size": 16, "micro_batch_size": micro_batch_size, "grad_clip": 1.0},
        cluster={"trainer": {"num_workers": 2}},
    )


def _sgd(model):
    """Plain SGD: the weight change is the (clipped) gradient itself, so equal weights mean
    equal gradients."""
    optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.05)
    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)


def _rank(rank: int, port: int, model_dir: str, out: str) -> None:
    from infra.trainer.rank import TrainerRank

    torch.set_num_threads(1)
    trainer = TrainerRank(_cfg(micro_batch_size=3), rank, 2)  # 8 rows a rank: micro-batches 3, 3, 2
    plan = trainer.setup_sft(model_dir, {}, ADDR, port)
    trainer.optimizer, trainer.scheduler = _sgd(trainer.model)
    metrics = [trainer.sft_epoch(epoch) for epoch in range(EPOCHS)]
    params = {n: p.full_tensor().clone() for n, p in trainer.model.named_parameters()}
    torch.save({"plan": plan, "metrics": metrics, "params": params}, f"{out}/rank{rank}.pt")
    trainer.shutdown()


def _one_process(model_dir: str) -> tuple[list[dict], dict]:
    from transformers import AutoModelForCausalLM

    from infra.data.labelled import sft_rows, tokenize_examples
    from infra.model.tokenizer import load_tokenizer
    from infra.trainer.sft import train_sft_epoch

    cfg = _cfg(micro_batch_size=16)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    examples, _ = tokenize_examples(cfg, sft_rows(cfg, {})[0], load_tokenizer(model_dir))
    optimizer, scheduler = _sgd(model)
    metrics = [
        train_sft_epoch(model, optimizer, scheduler, examples, e, rank=0, world_size=1, cfg=cfg.sft)
        for e in range(EPOCHS)
    ]
    return metrics, {n: p.detach() for n, p in model.named_parameters()}


def test_two_ranks_with_micro_batches_match_one_process(model_dir, tmp_path):
    spawn_ranks(_rank, free_port(), str(model_dir), str(tmp_path), nprocs=2)
    torch.set_num_threads(1)
    ref_metrics, ref_params = _one_process(str(model_dir))
    assert ref_metrics[0]["grad_norm"] > 1.0  # clipping was active: the norm must be global
    for rank in range(2):
        got = torch.load(tmp_path / f"rank{rank}.pt")
        assert got["plan"] == {"examples": 80, "dropped": 0, "eval_prompts_left_out": 0, "steps_per_epoch": 5}
        for mine, ref in zip(got["metrics"], ref_metrics, strict=True):
            assert mine["num_steps"] == ref["num_steps"] == 5
            assert mine["answer_tokens"] == ref["answer_tokens"] == 80 * 3  # two digits and the end token
            for key in ("loss", "grad_norm", "token_accuracy", "answer_accuracy"):
                assert mine[key] == pytest.approx(ref[key], abs=1e-5), key
        for name, tensor in ref_params.items():
            torch.testing.assert_close(got["params"][name], tensor, atol=1e-5, rtol=0, msg=name)
