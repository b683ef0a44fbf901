"""The built-in tiny model: a small Llama with a character-level tokenizer.

Built locally (no hub download is possible on CI machines) and saved as an ordinary HF
model directory, so the same `from_pretrained` path loads it as any real model.
"""

from __future__ import annotations

import string
from pathlib import Path

from infra.config import TinyModelConfig

# Part of the name of a machine's cached build (infra.model.loading.tiny_model_dir): raise it
# whenever build_tiny_model writes something else for the same settings.
BUILD_VERSION = 1
PAD, BOS, EOS, UNK = "<pad>", "<s>", "</s>", "<unk>"
# printable ASCII: letters, digits, punctuation and space; newline is a token too.
CHARACTERS = [c for c in string.printable if c not in "\t\r\x0b\x0c"]


def build_char_tokenizer():
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate([PAD, BOS, EOS, UNK, *CHARACTERS])}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK))
    # every character is its own token; Fuse joins them back without separators
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("[\\s\\S]"), behavior="isolated")
    tok.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token=PAD, bos_token=BOS, eos_token=EOS, unk_token=UNK
    )


def tiny_llama_config(cfg: TinyModelConfig, tokenizer):
    """The transformers config of the built-in model for these settings and tokenizer."""
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_heads,
        num_key_value_heads=cfg.num_heads,
        max_position_embeddings=cfg.max_position_embeddings,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        tie_word_embeddings=False,
        torch_dtype="float32",
    )


def build_tiny_model(out_dir: str | Path, cfg: TinyModelConfig) -> Path:
    """Write a freshly initialised tiny Llama and its tokenizer to `out_dir`."""
    import torch
    from transformers import LlamaForCausalLM

    tokenizer = build_char_tokenizer()
    config = tiny_llama_config(cfg, tokenizer)
    torch.manual_seed(cfg.seed)
    model = LlamaForCausalLM(config)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out
