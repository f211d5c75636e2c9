"""Tools as the engine sees them: which format a chat template implies, the grammar a reply is
decoded under (it compiles, and accepts and refuses what it should), and how tools, calls and
their outputs are rendered into a prompt (the template's own way, or the Hermes block)."""

from __future__ import annotations

import copy
import json

import pytest

from voicert.core.chat import ChatMessage, ToolCall, ToolChoice, ToolChoiceMode, ToolSpec
from voicert.engine.core.prompt import PromptBuilder
from voicert.engine.core.tools import CallFormat, call_format, call_grammar, offered

BOOK = ToolSpec.of(
    "book",
    "Book",
    {
        "type": "object",
        "required": ["n"],
        "additionalProperties": False,
        "properties": {"n": {"type": "integer"}},
    },
)
HOURS = ToolSpec.of("hours", "Hours")
AUTO, REQUIRED = ToolChoice(), ToolChoice(ToolChoiceMode.REQUIRED)
CALL = '<tool_call>\n{"name": "book", "arguments": {"n": 4}}\n</tool_call>'


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    from voicert.config import cache_dir, load_config
    from voicert.engine.loader import resolve_llm

    return AutoTokenizer.from_pretrained(
        str(resolve_llm("embedded", cache_dir(load_config(environ={}).models)))
    )


def _accepts(tokenizer, lark: str, text: str) -> bool:
    import llguidance.hf

    ll = llguidance.hf.from_tokenizer(tokenizer)
    matcher = llguidance.LLMatcher(ll, llguidance.LLMatcher.grammar_from_lark(lark))
    ids = tokenizer.encode(text, add_special_tokens=False)
    return matcher.validate_tokens(ids) == len(ids) and not matcher.is_error()


def test_the_format_follows_the_template():
    assert call_format("... <tool_call> ...") is CallFormat.HERMES
    assert call_format('{% if tools %} "parameters" ... {% endif %}') is CallFormat.LLAMA3
    assert call_format(None) is CallFormat.HERMES


def test_a_tool_name_and_schema_are_checked():
    with pytest.raises(ValueError):
        ToolSpec.of("has space")
    with pytest.raises(ValueError):
        ToolSpec.of("f", parameters={"type": "array"})
    with pytest.raises(ValueError):
        ToolChoice(ToolChoiceMode.NAMED)
    with pytest.raises(ValueError, match="not among"):
        offered((BOOK,), ToolChoice(ToolChoiceMode.NAMED, "nope"))


def test_no_grammar_without_tools_or_with_choice_none():
    assert call_grammar((), AUTO, CallFormat.HERMES) is None
    assert call_grammar((BOOK,), ToolChoice(ToolChoiceMode.NONE), CallFormat.HERMES) is None


def test_auto_allows_text_or_text_then_a_valid_call(tokenizer):
    lark = call_grammar((BOOK, HOURS), AUTO, CallFormat.HERMES, parallel=False)
    assert _accepts(tokenizer, lark, "It is open until ten.")
    assert _accepts(tokenizer, lark, "Let me book that. " + CALL)
    assert not _accepts(tokenizer, lark, '<tool_call>\n{"name": "book", "arguments": {"n": "x"')
    assert not _accepts(tokenizer, lark, '<tool_call>\n{"name": "cancel"')
    assert not _accepts(tokenizer, lark, CALL + " and more text")
    assert not _accepts(tokenizer, lark, CALL + "\n" + CALL)  # one call: parallel is off


def test_required_allows_only_calls_and_parallel_up_to_the_limit(tokenizer):
    lark = call_grammar((BOOK,), REQUIRED, CallFormat.HERMES)
    assert not _accepts(tokenizer, lark, "Sure")
    assert _accepts(tokenizer, lark, CALL + "\n" + CALL)


def test_llama3_calls_are_bare_json_with_parameters(tokenizer):
    lark = call_grammar((BOOK,), AUTO, CallFormat.LLAMA3)
    assert _accepts(tokenizer, lark, '{"name": "book", "parameters": {"n": 2}}')
    assert _accepts(tokenizer, lark, "Hello there")
    assert not _accepts(tokenizer, lark, '{"name": "book", "arguments": {"n": 2}}')


def test_a_template_without_tool_support_gets_them_in_the_system_prompt(tokenizer):
    builder = PromptBuilder(tokenizer)
    assert not builder.native_tools
    messages = [
        ChatMessage("system", "Be brief."),
        ChatMessage("user", "Book for 4"),
        ChatMessage("assistant", "Booking.", (ToolCall("c1", "book", '{"n": 4}'),)),
        ChatMessage("tool", '{"ok": true}', tool_call_id="c1"),
    ]
    text = tokenizer.decode(builder.build(messages, 2048, [BOOK]))
    assert text.startswith("<|im_start|>system\nBe brief.\n\n# Tools")
    assert json.dumps(BOOK.openai(), sort_keys=True) in text
    assert "<|im_start|>assistant\nBooking.\n" + CALL + "<|im_end|>" in text
    assert '<|im_start|>tool\n<tool_response>\n{"ok": true}\n</tool_response>' in text
    # the same conversation without tools offered: no block, the calls are still history
    plain = tokenizer.decode(builder.build(messages, 2048))
    assert "# Tools" not in plain and CALL in plain


def test_a_template_with_tool_support_renders_them_itself(tokenizer):
    tok = copy.copy(tokenizer)
    tok.chat_template = (  # a minimal template of the kind Qwen2.5 and Llama 3.1 ship
        "{% if tools %}TOOLS:{% for t in tools %}{{ t.function.name }};{% endfor %}\n{% endif %}"
        "{% for m in messages %}[{{ m.role }}]{{ m.content }}"
        "{% for c in m.tool_calls or [] %}CALL {{ c.function.name }} "
        "{{ c.function.arguments | tojson }}{% endfor %}"
        "{% if m.tool_call_id %} for {{ m.tool_call_id }}{% endif %}\n{% endfor %}"
        "{% if add_generation_prompt %}[assistant]{% endif %}"
    )
    builder = PromptBuilder(tok)
    assert builder.native_tools
    messages = [
        ChatMessage("user", "Book for 4"),
        ChatMessage("assistant", "", (ToolCall("c1", "book", '{"n": 4}'),)),
        ChatMessage("tool", "ok", tool_call_id="c1"),
    ]
    text = tok.decode(builder.build(messages, 2048, [BOOK, HOURS]))
    assert text == (
        'TOOLS:book;hours;[user]Book for 4[assistant]CALL book {"n": 4}[tool]ok for c1[assistant]'
    )  # (HF renders with trim_blocks)
