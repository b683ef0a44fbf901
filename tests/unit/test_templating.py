"""Prompt formatting with a real tokenizer and a real Jinja chat template."""

from __future__ import annotations

import pytest

from infra.data.templating import PromptFormatter, PromptTooLong
from infra.model.tiny import build_char_tokenizer

TEMPLATE = (
    "{% for m in messages %}[{{ m['role'] }}]{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}[assistant]{% endif %}"
)


@pytest.fixture(scope="module")
def tokenizer():
    tok = build_char_tokenizer()  # one token per character: lengths are easy to derive
    tok.chat_template = TEMPLATE
    return tok


def _text(tok, ids):
    return tok.decode(ids, skip_special_tokens=False)


def test_plain_text_is_encoded_as_is(tokenizer) -> None:
    f = PromptFormatter(tokenizer)
    assert _text(tokenizer, f.ids("7:")) == "7:"


def test_messages_use_the_template_with_the_generation_prompt(tokenizer) -> None:
    f = PromptFormatter(tokenizer)
    ids = f.ids([{"role": "user", "content": "2+3="}])
    assert _text(tokenizer, ids) == "[user]2+3=\n[assistant]"


def test_text_with_apply_chat_template_and_a_system_prompt(tokenizer) -> None:
    f = PromptFormatter(tokenizer, apply_chat_template=True, system_prompt="Be brief.")
    assert f.text("2+3=") == "[system]Be brief.\n[user]2+3=\n[assistant]"
    # a row that brings its own system message keeps it
    own = [{"role": "system", "content": "Mine."}, {"role": "user", "content": "q"}]
    assert f.text(own) == "[system]Mine.\n[user]q\n[assistant]"


def test_length_limit_drop_truncate_error(tokenizer) -> None:
    long = "x" * 20
    assert PromptFormatter(tokenizer, max_prompt_len=10).ids(long) is None
    kept = PromptFormatter(tokenizer, max_prompt_len=10, overlong="truncate_left").ids("abcdefghijklmnop")
    assert _text(tokenizer, kept) == "ghijklmnop"  # the last 10 characters
    with pytest.raises(PromptTooLong, match="data.max_prompt_len.*20 tokens.*10"):
        PromptFormatter(tokenizer, max_prompt_len=10, overlong="error").ids(long)
    assert PromptFormatter(tokenizer, max_prompt_len=20).ids(long) is not None  # at the limit


def test_clear_errors_for_a_tokenizer_without_template_and_bad_messages() -> None:
    plain = build_char_tokenizer()
    with pytest.raises(ValueError, match="data.apply_chat_template.*no chat template"):
        PromptFormatter(plain, apply_chat_template=True).ids("q")
    tok = build_char_tokenizer()
    tok.chat_template = TEMPLATE
    with pytest.raises(ValueError, match="message 0 needs 'role' and 'content'"):
        PromptFormatter(tok).ids([{"text": "q"}])
