"""From a prompt row to the token ids an engine receives: chat template, system prompt,
and the prompt length limit.

A row's prompt is either text or a list of chat messages (`[{"role", "content"}, ...]`,
the format of most instruct datasets). Messages always go through the tokenizer's chat
template, with the generation prompt appended; text does when `data.apply_chat_template`
is set (an instruct model must see its template, or it answers as a base model). Plain
text is encoded as is, without special tokens, as the base-model demo expects.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

Overlong = Literal["drop", "truncate_left", "error"]
Prompt = str | Sequence[Mapping[str, str]]


class PromptTooLong(ValueError):
    """A prompt over `data.max_prompt_len` with `data.overlong_prompt: error`."""


class PromptFormatter:
    def __init__(
        self,
        tokenizer: PreTrainedTokenizerBase,
        apply_chat_template: bool = False,
        system_prompt: str | None = None,
        max_prompt_len: int | None = None,
        overlong: Overlong = "drop",
    ) -> None:
        self.tokenizer = tokenizer
        self.apply_chat_template = apply_chat_template
        self.system_prompt = system_prompt
        self.max_prompt_len = max_prompt_len
        self.overlong = overlong

    def messages(self, prompt: Prompt) -> list[dict[str, str]]:
        msgs = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else [dict(m) for m in prompt]
        for i, m in enumerate(msgs):
            if "role" not in m or "content" not in m:
                raise ValueError(f"prompt: message {i} needs 'role' and 'content', got keys {sorted(m)}")
        if self.system_prompt and msgs[0]["role"] != "system":
            msgs.insert(0, {"role": "system", "content": self.system_prompt})
        return msgs

    def uses_template(self, prompt: Prompt) -> bool:
        return self.apply_chat_template or not isinstance(prompt, str)

    def full_ids(self, prompt: Prompt) -> list[int]:
        """Token ids of the whole prompt, before any length limit."""
        if not self.uses_template(prompt):
            return self.tokenizer.encode(prompt, add_special_tokens=False)
        if not getattr(self.tokenizer, "chat_template", None):
            raise ValueError(
                "data.apply_chat_template: the model's tokenizer has no chat template "
                "(chat messages or apply_chat_template need one; a base model takes plain text)"
            )
        out = self.tokenizer.apply_chat_template(
            self.messages(prompt), add_generation_prompt=True, tokenize=True
        )
        # transformers 5 answers a BatchEncoding; older releases a plain list
        return list(out["input_ids"] if isinstance(out, Mapping) else out)

    def ids(self, prompt: Prompt) -> list[int] | None:
        """The ids to generate from; None when the prompt is too long and is dropped."""
        ids = self.full_ids(prompt)
        limit = self.max_prompt_len
        if limit is None or len(ids) <= limit:
            return ids
        if self.overlong == "drop":
            return None
        if self.overlong == "truncate_left":
            # keep the end: the question and the generation prompt matter most to the answer
            return ids[-limit:]
        raise PromptTooLong(f"data.max_prompt_len: a prompt has {len(ids)} tokens, more than {limit}")

    def text(self, prompt: Prompt) -> str:
        """The prompt as the model sees it (stored with the sample, shown in artifacts)."""
        if not self.uses_template(prompt):
            return prompt
        return self.tokenizer.decode(self.full_ids(prompt), skip_special_tokens=False)
