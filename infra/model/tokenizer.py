"""Loading a model directory's tokenizer, without torch where transformers allows it.

`AutoTokenizer` imports transformers' model configuration code to resolve the tokenizer's
class, and torch with it (about 1.6 s more on 2 cores in the rollout manager's start, which
needs no torch otherwise). A directory whose `tokenizer_config.json` names the generic
tokenizers backend (the class transformers writes for a plain `tokenizer.json`, as the
built-in tiny model's) is loaded by that class directly: the same object AutoTokenizer
returns. Any other class goes through AutoTokenizer, which knows the model-specific ones.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

# transformers 5 writes TokenizersBackend; 4.x wrote PreTrainedTokenizerFast (an alias in 5)
GENERIC_CLASSES = {"TokenizersBackend", "PreTrainedTokenizerFast"}


def tokenizer_class(path: str) -> str | None:
    """The class named by `path`/tokenizer_config.json, None if there is no such file or name."""
    config = Path(path) / "tokenizer_config.json"
    if not config.is_file():
        return None
    try:
        return json.loads(config.read_text()).get("tokenizer_class")
    except (json.JSONDecodeError, AttributeError) as exc:
        raise ValueError(f"{config}: not a JSON object ({exc})") from exc


def load_tokenizer(path: str, **kwargs: Any) -> Any:
    """The tokenizer of the local HF directory `path` (kwargs go to `from_pretrained`)."""
    if tokenizer_class(path) in GENERIC_CLASSES and (Path(path) / "tokenizer.json").is_file():
        from transformers import PreTrainedTokenizerFast

        return PreTrainedTokenizerFast.from_pretrained(path, **kwargs)
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path, **kwargs)


def unknown_characters(tokenizer: Any, text: str) -> list[str]:
    """The characters of `text` that `tokenizer` can only write as its unknown token, in
    order of first appearance: none for byte-level tokenizers, any character outside
    printable ASCII for the built-in tiny model's character tokenizer."""
    unk = getattr(tokenizer, "unk_token_id", None)
    if unk is None:
        return []
    found: list[str] = []
    for char in dict.fromkeys(text):
        if unk in tokenizer.encode(char, add_special_tokens=False):
            found.append(char)
    return found


def describe_characters(chars: list[str]) -> str:
    """`'é' (U+00E9), '\\t' (U+0009)`: readable even for invisible characters."""
    return ", ".join(f"{c!r} (U+{ord(c):04X})" for c in chars)


def decode_many(tokenizer: Any, sequences: list[list[int]], skip_special_tokens: bool = True) -> list[str]:
    """`tokenizer.decode(ids, skip_special_tokens=...)` of every sequence, the same strings.

    transformers' `decode` converts its argument element by element in Python before the
    Rust tokenizer sees it (~6 ms per 1024 one-token samples, ~40 ms per 1024 of 96 tokens on
    2 cores): a rollout's batch of replies goes to the Rust tokenizer's `decode_batch` in one
    call instead (~5x faster), where the tokenizer's `decode` is transformers' generic fast
    one, which is that call alone when it does not clean up tokenization spaces. Any other
    tokenizer decodes each sequence itself."""
    if not _decodes_in_rust(tokenizer):
        return [tokenizer.decode(ids, skip_special_tokens=skip_special_tokens) for ids in sequences]
    return tokenizer.backend_tokenizer.decode_batch(list(sequences), skip_special_tokens=skip_special_tokens)


def _decodes_in_rust(tokenizer: Any) -> bool:
    from transformers import PreTrainedTokenizerFast

    kind = type(tokenizer)
    return (
        isinstance(tokenizer, PreTrainedTokenizerFast)
        and kind.decode is PreTrainedTokenizerFast.decode
        and kind._decode is PreTrainedTokenizerFast._decode
        and not tokenizer.clean_up_tokenization_spaces
    )
