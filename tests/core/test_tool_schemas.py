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


def _tree(required: list[str]) -> dict:
    return {
        "type": "object",
        "properties": {"label": {"type": "string"}, "child": {"$ref": "#/$defs/Node"}},
        "required": ["label"],
        "$defs": {
            "Node": {
                "type": "object",
                "properties": {"label": {"type": "string"}, "child": {"$ref": "#/$defs/Node"}},
                "required": required,
            }
        },
    }


def test_a_recursive_schema_with_a_way_out_is_declared():
    from voicert.core.chat import unsatisfiable

    assert unsatisfiable(_tree(["label"])) == ""  # a node's child is optional
    either = {"anyOf": [{"type": "string"}, {"type": "array", "items": {"$ref": "#"}}]}
    assert unsatisfiable({"type": "object", "properties": {"x": either}}) == ""
    listed = {"type": "array", "items": {"$ref": "#"}, "minItems": 0}
    assert unsatisfiable({"type": "object", "properties": {"x": listed}}) == ""
    ToolSpec.of("tree", "", _tree(["label"]))


def test_a_schema_that_must_nest_itself_forever_is_refused_naming_the_pointer():
    from voicert.core.chat import unsatisfiable

    assert "#/$defs/Node" in unsatisfiable(_tree(["label", "child"]))
    forever = {"type": "object", "properties": {"next": {"$ref": "#"}}, "required": ["next"]}
    assert "nest itself forever" in unsatisfiable(forever)
    nonempty = {"type": "array", "items": {"$ref": "#"}, "minItems": 1}
    assert unsatisfiable({"type": "object", "properties": {"x": nonempty}, "required": ["x"]})
    try:
        ToolSpec.of("tree", "", _tree(["label", "child"]))
    except ValueError as exc:
        assert "tool tree: parameters: no finite value" in str(exc)
    else:
        raise AssertionError("declared")


def test_a_schema_nested_too_deep_is_refused_not_a_recursion_error():
    from voicert.core.chat import MAX_SCHEMA_DEPTH, unsatisfiable

    deep: dict = {"type": "string"}
    for _ in range(MAX_SCHEMA_DEPTH + 5):
        deep = {"type": "object", "properties": {"a": deep}, "required": ["a"]}
    assert "deeper than" in unsatisfiable(deep)
