"""Supervised fine-tuning in one process on the tiny model: the loss is the cross-entropy of
the answer tokens only, the labelled examples are the prompts as a rollout formats them, and
an epoch's order and steps are a function of the seed and the epoch."""

from __future__ import annotations

import json

import pytest
import torch

import infra.trainer.sft as sft_module
from infra.config import EvalConfig, RunConfig, SFTConfig, TinyModelConfig
from infra.data.builtin_tasks import builtin_rows
from infra.data.labelled import Example, eval_prompts, sft_data_path, sft_rows, tokenize_examples
from infra.data.templating import PromptFormatter
from infra.model.tiny import build_char_tokenizer, build_tiny_model
from infra.trainer.sft import epoch_order, steps_per_epoch, train_sft_epoch


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("tiny"), TinyModelConfig())


def _model(model_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)


def _examples() -> list[Example]:
    # prompts of different lengths, answers of 1-3 tokens: padding and masks both matter
    rows = [([5, 6, 7], [8, 9]), ([10, 11], [12]), ([13, 14, 15, 16], [17, 18, 19]), ([20, 21, 22], [23, 24])]
    return [Example(p, a) for p, a in rows]


def _epoch(model, examples, micro_batch_size=2):
    """One SGD epoch of one step over every example; the metrics and each parameter's grad."""
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)  # the weights stay: grads compared
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0)
    grads: dict[str, torch.Tensor] = {}  # summed over the micro-batches' backwards
    for name, p in model.named_parameters():
        p.register_hook(lambda g, name=name: grads.__setitem__(name, grads.get(name, 0) + g))
    cfg = SFTConfig(batch_size=len(examples), micro_batch_size=micro_batch_size, grad_clip=1e9)
    metrics = train_sft_epoch(model, optimizer, scheduler, examples, 0, rank=0, world_size=1, cfg=cfg)
    return metrics, grads


def test_loss_is_the_mean_cross_entropy_of_the_answer_tokens(model_dir):
    model, examples = _model(model_dir), _examples()
    metrics, _ = _epoch(model, examples)
    nll = []
    with torch.no_grad():
        for e in examples:
            ids = torch.tensor([e.prompt_ids + e.answer_ids])
            logp = torch.log_softmax(model(input_ids=ids).logits[0, :-1], -1)
            targets = ids[0, 1:]
            per_token = -logp.gather(-1, targets[:, None])[:, 0]
            nll += per_token[len(e.prompt_ids) - 1 :].tolist()  # the positions that predict the answer
    assert metrics["answer_tokens"] == len(nll) == 8
    assert metrics["loss"] == pytest.approx(sum(nll) / len(nll), abs=1e-5)
    assert metrics["num_steps"] == 1 and metrics["skipped_steps"] == 0


def test_prompt_token_targets_change_neither_loss_nor_gradients(model_dir, monkeypatch):
    """The targets at prompt positions replaced by random tokens: the same loss and the same
    gradients, bit for bit; the same change at answer positions changes both."""
    baseline, base_grads = _epoch(_model(model_dir), _examples())
    seen = {}
    real_logits_of, real_logprobs = sft_module.logits_of, sft_module.token_logprobs

    def spy_logits(model, mb):
        seen["mask"] = mb.mask
        return real_logits_of(model, mb)

    def scrambled(where):
        def logprobs(logits, targets, temperature):
            noise = torch.randint_like(targets, 4, 90)
            return real_logprobs(logits, torch.where(where(seen["mask"]), noise, targets), temperature)

        return logprobs

    monkeypatch.setattr(sft_module, "logits_of", spy_logits)
    monkeypatch.setattr(sft_module, "token_logprobs", scrambled(lambda mask: mask == 0))
    prompt_scrambled, grads = _epoch(_model(model_dir), _examples())
    assert prompt_scrambled["loss"] == baseline["loss"]
    for name, g in base_grads.items():
        assert torch.equal(grads[name], g), name

    monkeypatch.setattr(sft_module, "token_logprobs", scrambled(lambda mask: mask == 1))
    answer_scrambled, grads = _epoch(_model(model_dir), _examples())
    assert answer_scrambled["loss"] != pytest.approx(baseline["loss"], abs=1e-3)
    assert not all(torch.equal(grads[n], g) for n, g in base_grads.items())


def test_micro_batches_do_not_change_the_step(model_dir):
    one, grads_one = _epoch(_model(model_dir), _examples(), micro_batch_size=4)
    split, grads_split = _epoch(_model(model_dir), _examples(), micro_batch_size=1)
    assert split["loss"] == pytest.approx(one["loss"], abs=1e-6)
    for name, g in grads_one.items():
        torch.testing.assert_close(grads_split[name], g, atol=1e-6, rtol=0, msg=name)


def test_an_epoch_is_shuffled_by_seed_and_epoch_and_leaves_the_remainder(model_dir):
    assert epoch_order(10, 0, 3) == epoch_order(10, 0, 3)
    assert sorted(epoch_order(10, 0, 3)) == list(range(10))
    assert epoch_order(10, 1, 3) != epoch_order(10, 0, 3) != epoch_order(10, 0, 4)
    assert steps_per_epoch(10, 4) == 2
    model = _model(model_dir)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0)
    metrics = train_sft_epoch(
        model, optimizer, scheduler, _examples() * 2 + _examples()[:1], 0,
        rank=0, world_size=1, cfg=SFTConfig(batch_size=4, micro_batch_size=2),
    )  # fmt: skip
    assert metrics["num_steps"] == 2  # 9 examples, steps of 4: one left for a later epoch's order
    with pytest.raises(ValueError, match="at least one step"):
        train_sft_epoch(
            model, optimizer, scheduler, _examples()[:3], 0,
            rank=0, world_size=1, cfg=SFTConfig(batch_size=4),
        )  # fmt: skip


def test_labelled_examples_are_the_prompts_as_rollouts_see_them_and_the_answer_ends():
    tokenizer = build_char_tokenizer()
    cfg = RunConfig(data={"train_path": "builtin:addition", "max_prompt_len": 5})
    assert sft_data_path(cfg) == "builtin:addition:sft"
    rows = [
        {"prompt": "13+18=", "label": "31"},
        {"prompt": "1+2=", "label": "3"},
        {"prompt": "1+1=", "label": ""},
    ]
    examples, dropped = tokenize_examples(cfg, rows, tokenizer)
    assert dropped == 2  # a prompt over max_prompt_len (drop), and an answer of no tokens
    formatter = PromptFormatter(tokenizer)
    assert examples == [Example(formatter.ids("1+2="), tokenizer.encode("3") + [tokenizer.eos_token_id])]
    plain = RunConfig(data={"train_path": "builtin:addition"}, sft={"append_eos": False})
    assert tokenize_examples(plain, rows[:1], tokenizer)[0][0].answer_ids == tokenizer.encode("31")
    assert sft_rows(plain, {}) == (builtin_rows("addition", "sft"), 0)


def test_labelled_rows_from_a_file_leave_out_every_prompt_the_run_evaluates(tmp_path):
    path = tmp_path / "qa.jsonl"
    rows = [{"question": f"{a}+{a}=", "answer": str(2 * a), "label": "x"} for a in range(20)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    extra = tmp_path / "extra.jsonl"
    extra.write_text(json.dumps({"question": "3+3=", "label": "6"}) + "\n")
    # no eval_path: the run holds 5% of the train file out for eval (1 row), never trained on
    named = RunConfig(
        data={"train_path": str(path), "prompt_key": "question"},
        sft={"data_path": str(path), "answer_key": "answer"},
        eval={"datasets": []},
    )
    kept, left_out = sft_rows(named, {})
    held = eval_prompts(named, {})
    assert left_out == len(held) == 1 and not {r["prompt"] for r in kept} & held
    assert kept == [
        {"prompt": r["question"], "label": r["answer"]} for r in rows if r["question"] not in held
    ]
    # an eval set of its own: its prompts are left out of SFT too
    with_set = named.model_copy(update={"eval": EvalConfig(datasets=[{"name": "x", "path": str(extra)}])})
    kept, left_out = sft_rows(with_set, {})
    assert left_out == 1 and "3+3=" not in {r["prompt"] for r in kept} and len(kept) == 19
    with pytest.raises(ValueError, match="sft.data_path is empty"):
        sft_data_path(RunConfig(data={"train_path": str(path)}))
