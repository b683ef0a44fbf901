"""Batched KV-cached sampling: per-row results must match a plain full forward."""

from __future__ import annotations

import pytest
import torch

from infra.config import TinyModelConfig
from infra.engine_server.sampling import RowSeeds, sample_batch
from infra.model.tiny import build_tiny_model

PROMPTS = [[1, 5, 6, 7, 8, 9, 10, 11], [1, 20], [1, 30, 31, 32, 33]]


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory):
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(1)
    path = build_tiny_model(tmp_path_factory.mktemp("tiny"), TinyModelConfig())
    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


def _sample(model, prompts=PROMPTS, seed=0, **kw):
    kw = {"max_new_tokens": 10, "temperature": 1.0, "eos_token_id": 2, "ignore_eos": True, **kw}
    return sample_batch(model, prompts, generator=torch.Generator().manual_seed(seed), **kw)


def _reference_logprobs(model, prompt: list[int], output: list[int], temperature: float) -> list[float]:
    with torch.no_grad():
        logits = model(torch.tensor([prompt + output])).logits[0].float()
    logprobs = torch.log_softmax(logits / temperature, dim=-1)
    return [logprobs[len(prompt) - 1 + i, tok].item() for i, tok in enumerate(output)]


@pytest.mark.parametrize("temperature,top_k,top_p", [(1.0, -1, 1.0), (0.7, 5, 0.9)])
def test_batched_logprobs_match_full_forward(model, temperature, top_k, top_p):
    # A fresh unpadded forward over prompt+output reproduces every returned logprob: this
    # holds only if left padding, position ids and the KV cache are all right.
    outs = _sample(model, temperature=temperature, top_k=top_k, top_p=top_p)
    for prompt, out in zip(PROMPTS, outs, strict=True):
        assert len(out.output_ids) == len(out.logprobs) == 10
        ref = _reference_logprobs(model, prompt, out.output_ids, temperature)
        torch.testing.assert_close(torch.tensor(out.logprobs), torch.tensor(ref), atol=1e-4, rtol=0)


def test_greedy_batch_equals_each_prompt_alone(model):
    batched = _sample(model, temperature=0.0)
    for prompt, out in zip(PROMPTS, batched, strict=True):
        (alone,) = _sample(model, prompts=[prompt], temperature=0.0)
        assert out.output_ids == alone.output_ids
        torch.testing.assert_close(
            torch.tensor(out.logprobs), torch.tensor(alone.logprobs), atol=1e-5, rtol=0
        )


def test_max_new_tokens_and_length_reason(model):
    outs = _sample(model, max_new_tokens=3)
    assert all(len(o.output_ids) == 3 for o in outs)
    assert all(o.finish_reason == {"type": "length", "length": 3} for o in outs)


def test_stop_token_ends_sequence_and_is_kept(model):
    # Stop on whatever greedy decoding emits third for row 0: it must end that row there.
    (free,) = _sample(model, prompts=PROMPTS[:1], temperature=0.0)
    stop = free.output_ids[2]
    outs = _sample(model, temperature=0.0, stop_token_ids={stop})
    first = outs[0]
    assert first.output_ids[-1] == stop and len(first.output_ids) == free.output_ids.index(stop) + 1
    assert first.finish_reason == {"type": "stop", "matched": stop}
    # rows that go on after row 0 stopped (fed pad tokens) are unaffected
    for prompt, out in zip(PROMPTS, outs, strict=True):
        ref = _reference_logprobs(model, prompt, out.output_ids, 1.0)
        torch.testing.assert_close(torch.tensor(out.logprobs), torch.tensor(ref), atol=1e-4, rtol=0)


def test_eos_stops_unless_ignored(model):
    (free,) = _sample(model, prompts=PROMPTS[:1], temperature=0.0)
    eos = free.output_ids[0]
    (stopped,) = _sample(model, prompts=PROMPTS[:1], temperature=0.0, eos_token_id=eos, ignore_eos=False)
    assert stopped.output_ids == [eos] and stopped.finish_reason == {"type": "stop", "matched": eos}
    (ignored,) = _sample(model, prompts=PROMPTS[:1], temperature=0.0, eos_token_id=eos, ignore_eos=True)
    assert len(ignored.output_ids) == 10


def test_same_seed_same_output_other_seed_differs(model):
    a, b, c = _sample(model, seed=3), _sample(model, seed=3), _sample(model, seed=4)
    assert [o.output_ids for o in a] == [o.output_ids for o in b]
    assert [o.logprobs for o in a] == [o.logprobs for o in b]
    assert [o.output_ids for o in a] != [o.output_ids for o in c]


def test_logprobs_come_from_raw_logits_under_top_k(model):
    # top_k=1 makes sampling deterministic, but the logprob is still that of the full
    # distribution at the temperature, not log(1) = 0 of the truncated one.
    outs = _sample(model, top_k=1, temperature=0.8)
    greedy = _sample(model, temperature=0.0)
    for out, g, prompt in zip(outs, greedy, PROMPTS, strict=True):
        assert out.output_ids == g.output_ids
        assert all(lp < -1e-3 for lp in out.logprobs)
        ref = _reference_logprobs(model, prompt, out.output_ids, 0.8)
        torch.testing.assert_close(torch.tensor(out.logprobs), torch.tensor(ref), atol=1e-4, rtol=0)


def test_abort_marks_unfinished_rows(model):
    calls = []

    def abort_after_two() -> list[bool]:
        calls.append(1)
        return [len(calls) > 2] * len(PROMPTS)

    outs = _sample(model, should_abort=abort_after_two)
    assert all(o.finish_reason == {"type": "abort"} and len(o.output_ids) == 2 for o in outs)


def test_abort_one_row_leaves_the_others(model):
    calls = []

    def abort_first_after_two() -> list[bool]:
        calls.append(1)
        return [len(calls) > 2] + [False] * (len(PROMPTS) - 1)

    outs = _sample(model, should_abort=abort_first_after_two, max_new_tokens=6, ignore_eos=True)
    assert outs[0].finish_reason == {"type": "abort"} and len(outs[0].output_ids) == 2
    assert all(o.finish_reason == {"type": "length", "length": 6} for o in outs[1:])
    assert all(len(o.output_ids) == 6 for o in outs[1:])


def test_per_row_generators_make_rows_independent_of_their_batch(model):
    def seeded(prompts, seeds):
        return sample_batch(
            model, prompts, generator=RowSeeds(seeds), max_new_tokens=5, temperature=1.0, ignore_eos=True
        )

    both = seeded([PROMPTS[0], PROMPTS[0]], [1, 2])
    alone = seeded([PROMPTS[0]], [2])
    assert both[1].output_ids == alone[0].output_ids
    assert both[0].output_ids != both[1].output_ids  # same prompt, own seeds: the copies differ


def test_copies_of_a_prompt_share_one_prefill_and_decode_as_their_own_rows(model, monkeypatch):
    """A GRPO group asks for n samples of one prompt: its prompt is run through the model
    once, and every copy then decodes on its own cache, as if prefilled alone."""
    from infra.engine_server import lean_llama

    rows_run: list[int] = []
    step = lean_llama.LeanLlamaDecoder.__call__

    def counted(self, input_ids, position_ids):
        rows_run.append(input_ids.shape[0])
        return step(self, input_ids, position_ids)

    monkeypatch.setattr(lean_llama.LeanLlamaDecoder, "__call__", counted)
    prompts = [PROMPTS[i % 3] for i in range(9)]  # each prompt 3 times, interleaved
    outs = sample_batch(model, prompts, generator=RowSeeds(list(range(9))), max_new_tokens=6, ignore_eos=True)
    assert rows_run == [3] + [9] * 5  # the prefill on the distinct prompts, then every row
    for prompt, out in zip(prompts, outs, strict=True):
        ref = _reference_logprobs(model, prompt, out.output_ids, 1.0)
        torch.testing.assert_close(torch.tensor(out.logprobs), torch.tensor(ref), atol=1e-4, rtol=0)
    # a copy draws with its own seed, as it would in a batch of distinct prompts
    (alone,) = sample_batch(model, [prompts[4]], generator=RowSeeds([4]), max_new_tokens=6, ignore_eos=True)
    assert outs[4].output_ids == alone.output_ids
    assert len({tuple(o.output_ids) for o in outs[0::3]}) > 1  # same prompt, own draws
    # one new token: the prefill's logits alone, copied to every row
    firsts = sample_batch(
        model, prompts, generator=RowSeeds(list(range(9))), max_new_tokens=1, ignore_eos=True
    )
    assert [o.output_ids for o in firsts] == [o.output_ids[:1] for o in outs]
    assert [o.logprobs for o in firsts] == [o.logprobs[:1] for o in outs]


def test_per_row_draws_follow_the_distribution():
    from infra.engine_server.sampling import _draw

    probs = torch.tensor([0.5, 0.0, 0.3, 0.2, 0.0]).repeat(20000, 1)
    uniforms = RowSeeds(list(range(len(probs)))).uniforms(1)[0]  # one draw per row, seeds 0..N-1
    tokens = _draw(probs, None, uniforms)
    freq = torch.bincount(tokens, minlength=5).double() / len(tokens)
    assert freq[1] == 0 and freq[4] == 0  # zero-probability tokens never come out
    torch.testing.assert_close(freq, probs[0].double(), atol=0.015, rtol=0)


@pytest.mark.parametrize("fuse", [True, False])
def test_lean_llama_decoder_gives_the_hf_forward_logits(model, fuse):
    """The built-in engine's lean decode step (Llama) against transformers' forward, on
    left-padded prompts: prefill and every decode step, the same logits; with the layers'
    matmuls fused (as for small float32 models) and with the module weights as they are."""
    from infra.engine_server import lean_llama
    from infra.engine_server.sampling import _HFDecoder, _left_pad

    assert lean_llama.supports(model)
    assert lean_llama.should_fuse(model)  # the tiny model is small enough
    ids, mask, positions = _left_pad(PROMPTS, 0, torch.device("cpu"))
    lean, hf = lean_llama.LeanLlamaDecoder(model, mask, 6, fuse=fuse), _HFDecoder(model, mask)
    step_ids, step_positions = ids, positions
    with torch.inference_mode():
        for step in range(6):
            got, want = lean(step_ids, step_positions), hf(step_ids, step_positions)
            assert torch.isfinite(got).all()
            torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
            step_ids = torch.tensor([[5 + step], [40], [7]])  # any tokens: both see the same
            step_positions = positions[:, -1:] + step + 1


def test_models_the_lean_step_does_not_cover_use_the_hf_forward(tmp_path):
    from transformers import AutoModelForCausalLM

    from infra.engine_server import lean_llama

    path = build_tiny_model(tmp_path, TinyModelConfig())
    config = AutoModelForCausalLM.from_pretrained(path).config
    config.attention_bias = True  # a bias the lean step does not add
    biased = AutoModelForCausalLM.from_config(config).eval()
    assert not lean_llama.supports(biased)
    outs = sample_batch(biased, PROMPTS, max_new_tokens=3, eos_token_id=2, ignore_eos=True)
    assert [len(o.output_ids) for o in outs] == [3, 3, 3]


@pytest.mark.parametrize("fuse", [True, False])
def test_lean_llama_decoder_with_grouped_kv_heads(tmp_path, fuse):
    """Two query heads per key/value head (GQA): the lean step groups the queries of one
    kv head into one matmul; its logits still match transformers' forward."""
    from transformers import AutoModelForCausalLM

    from infra.engine_server import lean_llama
    from infra.engine_server.sampling import _HFDecoder, _left_pad

    config = AutoModelForCausalLM.from_pretrained(build_tiny_model(tmp_path, TinyModelConfig())).config
    config.num_key_value_heads = config.num_attention_heads // 2
    torch.manual_seed(0)
    gqa = AutoModelForCausalLM.from_config(config).eval()
    assert lean_llama.supports(gqa)
    ids, mask, positions = _left_pad(PROMPTS, 0, torch.device("cpu"))
    lean, hf = lean_llama.LeanLlamaDecoder(gqa, mask, 4, fuse=fuse), _HFDecoder(gqa, mask)
    step_ids, step_positions = ids, positions
    with torch.inference_mode():
        for step in range(4):
            torch.testing.assert_close(
                lean(step_ids, step_positions), hf(step_ids, step_positions), atol=1e-5, rtol=1e-5
            )
            step_ids = torch.tensor([[9 + step], [41], [3]])
            step_positions = positions[:, -1:] + step + 1


def test_row_seeds_draw_splitmix64_per_row():
    # SplitMix64 seeded with 0 first gives 0xE220A8397B1DCDAF (its published reference value)
    first = RowSeeds([0]).uniforms(1)[0, 0].item()
    assert first == (0xE220A8397B1DCDAF >> 11) * 2.0**-53
    seeds = [7, -3, 2**70 + 5, 0, 7]
    draws = RowSeeds(seeds).uniforms(6)
    assert draws.shape == (6, 5) and draws.dtype == torch.float64
    assert torch.equal(draws[:, 0], draws[:, 4])  # a seed's draws, wherever its row is
    assert torch.equal(draws[:, 1], RowSeeds([-3]).uniforms(6)[:, 0])  # and whatever its batch
    assert torch.equal(draws[:3], RowSeeds(seeds).uniforms(3))  # more steps extend, not change
    many = RowSeeds(list(range(4000))).uniforms(5)
    assert many.min() >= 0.0 and many.max() < 1.0
    assert abs(many.mean().item() - 0.5) < 0.01 and len(set(many.flatten().tolist())) == many.numel()
