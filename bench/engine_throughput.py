"""Built-in engine tokens/s (its HTTP /generate) against transformers `generate`, side by side.

    python -m bench.engine_throughput [--batch 64 --prompt-len 8 --new-tokens 32 --repeats 3]

Same tiny demo model, same batch of prompts, same lengths (ignore_eos / min_new_tokens, so
every row makes exactly --new-tokens tokens), same sampling (T=1, no top-k/top-p), one
torch thread on each side. The engine gets one batched request shaped as the rollout
manager sends it (a sampling_seed per row, logprobs returned); HF generates in-process with
`do_sample=True` and no logprobs. Figures are new tokens per second of wall time.

Then the engine alone on a request shaped as the demo's rollout (128 prompts x 8 samples,
1 new token each) against 1024 distinct prompts of the same length: the copies of a prompt
share its prefill.
"""

from __future__ import annotations

import argparse
import random
import tempfile
import time
from pathlib import Path

import torch

from bench.common import ratio_line, spread
from tests.ports import free_port

ADDR = "127.0.0.1"
GROUPS, COPIES = 128, 8  # the demo's rollout: 128 prompts x 8 samples


def _prompts(batch: int, length: int, vocab: int, seed: int = 0) -> list[list[int]]:
    g = random.Random(seed)
    return [[g.randrange(4, vocab) for _ in range(length)] for _ in range(batch)]


def _engine_run(client, prompts: list[list[int]], new_tokens: int) -> tuple[float, int]:
    params = {"max_new_tokens": new_tokens, "temperature": 1.0, "top_p": 1.0, "top_k": -1, "ignore_eos": True}
    t0 = time.perf_counter()
    outs = client.generate(prompts, [{**params, "sampling_seed": i} for i in range(len(prompts))])
    return time.perf_counter() - t0, sum(len(o["output_ids"]) for o in outs)


def _hf_run(model, prompts: list[list[int]], new_tokens: int, pad_id: int) -> tuple[float, int]:
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[pad_id] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    t0 = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(
            input_ids=ids, attention_mask=mask, do_sample=True, temperature=1.0, top_k=0, top_p=1.0,
            max_new_tokens=new_tokens, min_new_tokens=new_tokens, pad_token_id=pad_id,
        )  # fmt: skip
    return time.perf_counter() - t0, int((out.shape[1] - width) * out.shape[0])


def _grouped_and_distinct(
    client, grouped: list[list[int]], distinct: list[list[int]], repeats: int
) -> tuple[list[float], list[float]]:
    """Samples/s of a GRPO request at the demo's shape (copies of each prompt share its
    prefill) and of as many distinct prompts, 1 new token each, alternating."""
    _engine_run(client, grouped, 1)  # warm-up: the first batch of this size
    _engine_run(client, distinct, 1)
    shared_rate, distinct_rate = [], []
    for _ in range(repeats):
        seconds, tokens = _engine_run(client, grouped, 1)
        shared_rate.append(tokens / seconds)
        seconds, tokens = _engine_run(client, distinct, 1)
        distinct_rate.append(tokens / seconds)
    return shared_rate, distinct_rate


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--prompt-len", type=int, default=8)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    from transformers import AutoModelForCausalLM, GenerationConfig

    from infra.config import TinyModelConfig
    from infra.engines.client import EngineClient
    from infra.engines.launch import launch_engine, stop_engine, wait_until_healthy
    from infra.model.tiny import build_tiny_model

    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = build_tiny_model(Path(tmp) / "model", TinyModelConfig())
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
        model.generation_config = GenerationConfig()  # no defaults from the checkpoint
        pad_id = model.config.eos_token_id or 0

        def prompts_of(count: int, length: int, seed: int = 0) -> list[list[int]]:
            return _prompts(count, length, model.config.vocab_size, seed)

        prompts = prompts_of(args.batch, args.prompt_len)
        port = free_port()
        proc = launch_engine("torch", str(model_dir), ADDR, port, seed=0, threads=1)
        try:
            wait_until_healthy(f"http://{ADDR}:{port}", proc, 120)
            client = EngineClient(f"http://{ADDR}:{port}")
            _engine_run(client, prompts[:2], 2)  # warm-up, both sides
            _hf_run(model, prompts[:2], 2, pad_id)
            engine, hf = [], []
            for _ in range(args.repeats):  # alternate, so drift on a shared machine hits both
                seconds, tokens = _engine_run(client, prompts, args.new_tokens)
                engine.append(tokens / seconds)
                seconds, tokens = _hf_run(model, prompts, args.new_tokens, pad_id)
                hf.append(tokens / seconds)
            grouped = [p for p in prompts_of(GROUPS, args.prompt_len) for _ in range(COPIES)]
            distinct = prompts_of(GROUPS * COPIES, args.prompt_len)
            shared_rate, distinct_rate = _grouped_and_distinct(client, grouped, distinct, args.repeats)
        finally:
            stop_engine(proc)
    print(
        f"tiny demo model; batch {args.batch}, prompt {args.prompt_len} tokens, {args.new_tokens} new tokens "
        "each, T=1, 1 thread per side"
    )
    print(f"built-in engine (HTTP /generate) tokens/s: {spread(engine, '{:.0f}')}")
    print(f"transformers generate       tokens/s: {spread(hf, '{:.0f}')}")
    ratios = [e / h for e, h in zip(engine, hf, strict=True)]
    print(ratio_line("built-in engine / transformers generate, tokens/s", ratios, ">= 1.5x"))
    print(
        f"built-in engine, {GROUPS} prompts x {COPIES} samples, 1 new token each, samples/s: "
        f"{spread(shared_rate, '{:.0f}')}; {GROUPS * COPIES} distinct prompts: {spread(distinct_rate, '{:.0f}')}"
    )
    ratios = [a / b for a, b in zip(shared_rate, distinct_rate, strict=True)]
    print(ratio_line("built-in engine, copies of a prompt / distinct prompts, samples/s", ratios, "> 1x"))


if __name__ == "__main__":
    main()
