"""The floor's chat words: a tool schema is checked once however often it is declared."""

import uuid

import llguidance

from voicert.core.chat import ToolSpec


def test_a_schema_declared_again_is_not_checked_again(monkeypatch):
    calls = []
    real = llguidance.LLMatcher.validate_grammar

    def counting(grammar, *args, **kwargs):
        calls.append(grammar)
        return real(grammar, *args, **kwargs)

    monkeypatch.setattr(llguidance.LLMatcher, "validate_grammar", counting)
    unseen = f"when_{uuid.uuid4().hex}"  # a schema no earlier test in this process declared
    schema = {"type": "object", "properties": {unseen: {"type": "string", "format": "date-time"}}}
    first = ToolSpec.of("book", "", schema)
    again = ToolSpec.of("book_again", "another name, the same schema", schema)
    assert len(calls) == 1 and first.parameters == again.parameters
    ToolSpec.of("other", "", {"type": "object", "properties": {unseen: {"type": "integer"}}})
    assert len(calls) == 2


def test_a_refused_schema_is_refused_again_from_the_cache():
    bad = {"type": "object", "properties": {"x": {"$ref": "#/nowhere"}}}
    for _ in range(2):
        try:
            ToolSpec.of("odd", "", bad)
        except ValueError as exc:
            assert "nowhere" in str(exc)
        else:
            raise AssertionError("a dangling $ref was accepted")
