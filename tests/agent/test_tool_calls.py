"""The reply's text split into what is said and its tool calls, whatever the token boundaries."""

import json

import pytest

from voicert.agent.tool_calls import (
    CallArgs,
    CallBroken,
    CallClosed,
    CallOpened,
    CallParser,
    RepeatFilter,
    Said,
)

HERMES = (
    'Sure, one moment. <tool_call>\n{"name": "book", "arguments": {"people": 4, '
    '"note": "a } \\" {"}}\n</tool_call>\n<tool_call>\n{"name": "hours", "arguments": {}}'
    "\n</tool_call>"
)


def _parse(text: str, step: int):
    parser = CallParser()
    out = []
    for i in range(0, len(text), step):
        out += parser.feed(text[i : i + step])
    return out + parser.close()


def _said(pieces) -> str:
    return "".join(p.text for p in pieces if isinstance(p, Said))


def _args(pieces) -> dict[int, str]:
    args: dict[int, str] = {}
    for p in pieces:
        if isinstance(p, CallArgs):
            args[p.index] = args.get(p.index, "") + p.delta
    return args


@pytest.mark.parametrize("step", [1, 2, 3, 7, 1000])
def test_hermes_calls_are_cut_out_of_the_said_text_and_their_arguments_stream(step):
    pieces = _parse(HERMES, step)
    assert _said(pieces) == "Sure, one moment. "
    closed = [p for p in pieces if isinstance(p, CallClosed)]
    assert [(c.name, json.loads(c.arguments)) for c in closed] == [
        ("book", {"people": 4, "note": 'a } " {'}),
        ("hours", {}),
    ]
    assert _args(pieces) == {0: closed[0].arguments, 1: closed[1].arguments}
    opened = [p for p in pieces if isinstance(p, CallOpened)]
    assert [o.name for o in opened] == ["book", "hours"]
    # each call opens before its first argument delta and closes after its last
    order = [(type(p).__name__, p.index) for p in pieces if not isinstance(p, Said)]
    assert (
        order.index(("CallOpened", 0))
        < order.index(("CallArgs", 0))
        < order.index(("CallClosed", 0))
    )


@pytest.mark.parametrize("step", [1, 4, 1000])
def test_a_llama3_reply_that_opens_with_json_is_a_call(step):
    pieces = _parse('<|python_tag|>{"name": "book", "parameters": {"a": [1, {"b": 2}]}}', step)
    assert _said(pieces) == ""
    assert [(p.name, p.arguments) for p in pieces if isinstance(p, CallClosed)] == [
        ("book", '{"a": [1, {"b": 2}]}')
    ]


def test_text_that_only_looks_like_a_marker_is_said_at_the_end():
    assert _said(_parse("Use the <tool", 1)) == "Use the <tool"
    assert _said(_parse("a < b and <tools> are fine", 3)) == "a < b and <tools> are fine"


def test_a_call_cut_off_by_the_length_limit_is_broken_not_made():
    pieces = _parse('Hi <tool_call>\n{"name": "bo', 2)
    assert _said(pieces) == "Hi " and isinstance(pieces[-1], CallBroken)
    assert not [p for p in pieces if isinstance(p, CallClosed)]


def test_arguments_in_another_key_order_arrive_whole_at_the_close():
    pieces = _parse('<tool_call>\n{"arguments": {"x": 1}, "name": "f"}\n</tool_call>', 5)
    assert [(p.name, json.loads(p.arguments)) for p in pieces if isinstance(p, CallClosed)] == [
        ("f", {"x": 1})
    ]
    assert json.loads(_args(pieces)[0]) == {"x": 1}


def test_a_call_that_is_not_json_is_broken():
    pieces = _parse("<tool_call>\nnot json\n</tool_call> after", 4)
    assert isinstance([p for p in pieces if not isinstance(p, Said)][-1], CallBroken)
    assert _said(pieces) == "after"


def _filtered(text: str, step: int):
    parser, repeats, out = CallParser(), RepeatFilter(), []
    for i in range(0, len(text), step):
        out += repeats.push(parser.feed(text[i : i + step]))
    return out + repeats.push(parser.close())


CALL_A = '<tool_call>\n{"name": "book", "arguments": {"n": 4}}\n</tool_call>'
CALL_B = '<tool_call>\n{"name": "book", "arguments": {"n": 40}}\n</tool_call>'


@pytest.mark.parametrize("step", [1, 5, 1000])
def test_an_exact_repeat_of_a_call_is_dropped_unseen(step):
    out = _filtered(f"{CALL_A}\n{CALL_A}\n{CALL_A}", step)
    assert [type(p).__name__ for p in out].count("CallOpened") == 1
    assert [(p.name, p.arguments) for p in out if isinstance(p, CallClosed)] == [
        ("book", '{"n": 4}')
    ]


@pytest.mark.parametrize("step", [1, 5, 1000])
def test_a_call_that_only_starts_like_an_earlier_one_comes_out_whole(step):
    out = _filtered(f"{CALL_A}\n{CALL_B}", step)
    closed = [p for p in out if isinstance(p, CallClosed)]
    assert [c.arguments for c in closed] == ['{"n": 4}', '{"n": 40}']
    assert "".join(p.delta for p in out if isinstance(p, CallArgs) and p.index == 1) == '{"n": 40}'
    assert next(type(p).__name__ for p in out if getattr(p, "index", None) == 1) == "CallOpened"


def test_a_repeat_cut_off_by_the_length_limit_is_not_reported():
    out = _filtered(f'{CALL_A}\n<tool_call>\n{{"name": "book", "arguments": {{"n"', 3)
    assert not [p for p in out if isinstance(p, CallBroken)]
    out = _filtered('<tool_call>\n{"name": "book", "arg', 3)
    assert [p for p in out if isinstance(p, CallBroken)]
