"""Tool schemas under arbitrary input (hypothesis): whatever ``ToolSpec.of`` accepts at
declaration, the engine can decode under, in every call format and choice; whatever it refuses
is a ``ValueError``. Schemas are drawn in the shapes clients send, pydantic's and msgspec's
``$defs`` / ``$ref`` included, with a few hostile turns (loops, dangling pointers, odd types)."""

from __future__ import annotations

import json

import llguidance
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from voicert.core.chat import ToolChoice, ToolChoiceMode, ToolSpec
from voicert.engine.core.tools import CallFormat, call_grammar

FUZZ = settings(
    max_examples=300,
    deadline=None,
    derandomize=True,  # the same schemas on every run: CI sees what was seen here
    suppress_health_check=[HealthCheck.too_slow],
)
NAMES = st.sampled_from(["Address", "Item", "Node", "a", "x_y", "Ünï", "with space", "$x", ""])


def _ref(name: str, section: str = "$defs") -> dict:
    return {"$ref": f"#/{section}/{name}"}


leaf = st.one_of(
    st.fixed_dictionaries({"type": st.sampled_from(["string", "integer", "number", "boolean"])}),
    st.fixed_dictionaries(
        {"type": st.just("string")},
        optional={
            "pattern": st.sampled_from(["^[a-z]+$", "\\d{3}", "(", "^((a{100}){100}){100}$"]),
            "maxLength": st.integers(-1, 100),
            "enum": st.lists(st.text(max_size=4), max_size=3),
            "format": st.sampled_from(["date-time", "email", "uuid", "nonsense"]),
        },
    ),
    st.builds(_ref, NAMES, st.sampled_from(["$defs", "definitions"])),
    st.sampled_from([{"$ref": "#"}, {"$ref": "#/properties/a"}, {"$ref": "http://x/y"}, {}]),
    st.sampled_from([{"type": "null"}, {"type": ["string", "null"]}, {"type": "tuple"}, True]),
)
schemas = st.recursive(
    leaf,
    lambda inner: st.one_of(
        st.builds(
            lambda props, req, extra: {
                "type": "object",
                "properties": props,
                "required": req,
                **extra,
            },
            st.dictionaries(NAMES, inner, max_size=3),
            st.lists(NAMES, max_size=2),
            st.sampled_from([{}, {"additionalProperties": False}, {"additionalProperties": 3}]),
        ),
        st.builds(lambda items: {"type": "array", "items": items}, inner),
        st.builds(lambda xs: {"anyOf": xs}, st.lists(inner, min_size=1, max_size=3)),
    ),
    max_leaves=8,
)
tool_schemas = st.builds(
    lambda root, defs, section: {**root, section: defs} if defs else root,
    schemas.filter(lambda s: isinstance(s, dict)),
    st.dictionaries(NAMES, schemas, max_size=3),
    st.sampled_from(["$defs", "definitions"]),
)


@FUZZ
@given(schema=tool_schemas, fmt=st.sampled_from(list(CallFormat)))
@example(  # found by a random run: a definition named "" was pointed at the root's $defs
    schema={"$ref": "#/$defs/", "$defs": {"Address": {"type": "string"}, "": {"type": "string"}}},
    fmt=CallFormat.HERMES,
)
def test_a_declared_schema_can_always_be_decoded_under(schema, fmt):
    try:
        spec = ToolSpec.of("f", "", schema)
    except ValueError:
        return  # refused at declaration: the door answers a typed error
    for choice in (ToolChoice(), ToolChoice(ToolChoiceMode.REQUIRED)):
        grammar = call_grammar((spec,), choice, fmt)
        problem = llguidance.LLMatcher.validate_grammar(
            llguidance.LLMatcher.grammar_from_lark(grammar)
        )
        assert problem == "", f"{json.dumps(schema)} declared, then its call grammar: {problem}"


@pytest.mark.parametrize(
    "schema",
    [
        {
            "type": "object",
            "properties": {"a": _ref("A")},
            "$defs": {"A": _ref("B"), "B": _ref("A")},
        },
        {"type": "object", "properties": {"a": _ref("A")}, "$defs": {"A": _ref("A")}},
    ],
)
def test_a_ref_loop_with_nothing_to_decode_is_refused_at_declaration(schema):
    with pytest.raises(ValueError):
        ToolSpec.of("f", "", schema)
