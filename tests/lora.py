"""LoRA adapters for tests: PEFT adapters with random non-zero A and B, saved as
`PeftModel.save_pretrained` saves them, and transformers + peft's logprobs of given tokens
as the reference an engine's per-token logprobs are held to."""

from __future__ import annotations

from pathlib import Path

import torch

# every linear layer of a Llama, the output layer too (configs/lora.yaml trains one there)
ALL_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj", "lm_head"]


def make_adapter(
    model_dir: Path,
    out_dir: Path,
    seed: int,
    r: int = 4,
    alpha: float = 8.0,
    targets: list[str] | None = None,
    **config,
) -> Path:
    """A PEFT adapter of the model at `model_dir` in `out_dir`, its weights seeded noise."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    lora = LoraConfig(r=r, lora_alpha=alpha, target_modules=targets or ALL_TARGETS, **config)
    peft_model = get_peft_model(model, lora)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in peft_model.named_parameters():
            if "lora_" in name:  # B too (peft starts it at zero): the adapter must change outputs
                param.copy_(0.1 * torch.randn(param.shape, generator=gen))
    peft_model.save_pretrained(out_dir)
    return Path(out_dir)


class Reference:
    """transformers' forward of the model, with the adapter applied by peft (or none)."""

    def __init__(self, model_dir: Path, adapter_dir: Path | None = None):
        from peft import PeftModel
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        self.model = (PeftModel.from_pretrained(model, adapter_dir) if adapter_dir else model).eval()

    def logprobs(self, prompt: list[int], output: list[int]) -> list[float]:
        """The log-softmax (temperature 1) of every output token after what precedes it."""
        with torch.no_grad():
            logits = self.model(torch.tensor([prompt + output])).logits[0].float()
        logprobs = torch.log_softmax(logits, dim=-1)
        return [logprobs[len(prompt) - 1 + i, tok].item() for i, tok in enumerate(output)]


def max_diff(reference: Reference, prompt: list[int], output: list[int], logprobs: list[float]) -> float:
    want = reference.logprobs(prompt, output)
    assert len(want) == len(logprobs) > 0
    return max(abs(a - b) for a, b in zip(want, logprobs, strict=True))


def assert_unload_waits(client, name: str, inputs: int, tokens: int, hold_s: float, reply_s: float) -> None:
    """Unload adapter `name` while a generation of `inputs` x `tokens` tokens uses it: the
    unload must answer as that generation ends (within `reply_s` of it, the reply's own
    travel), not at once, and the generation must run to its end. `hold_s`: how long after
    the request starts the adapter is surely held by it."""
    import threading
    import time

    long = {"max_new_tokens": tokens, "temperature": 1.0, "ignore_eos": True}
    result: dict = {}

    def generate() -> None:
        result["outs"] = client.generate([[1, 9 + i] for i in range(inputs)], long, lora_path=name)
        result["done"] = time.monotonic()

    thread = threading.Thread(target=generate)
    thread.start()
    time.sleep(hold_s)
    assert thread.is_alive(), "the generation ended before the unload: make it longer"
    client.unload_lora_adapter(name)
    unloaded = time.monotonic()
    thread.join(300)
    assert result["done"] - unloaded < reply_s
    assert all(len(out["output_ids"]) == tokens for out in result["outs"])


def max_diff_of_replies(reference: Reference, prompts: list[list[int]], outs: list[dict]) -> float:
    """The largest gap over /generate replies (one per prompt) between each reply's per-token
    logprobs and the reference's for the same tokens."""
    diffs = []
    for prompt, out in zip(prompts, outs, strict=True):
        logprobs = [lp for lp, _, _ in out["meta_info"]["output_token_logprobs"]]
        diffs.append(max_diff(reference, prompt, out["output_ids"], logprobs))
    return max(diffs)
