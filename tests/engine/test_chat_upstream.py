"""The client side of chat completions (engine/clients/chat_upstream.py): the bodies voicert sends an
OpenAI-compatible server, and its stream read back, tool calls included, as the agent's call
parser reads them."""

from __future__ import annotations

import json

import pytest

from voicert.agent import tool_calls as tc
from voicert.core.chat import ChatMessage, ToolCall, ToolChoice, ToolChoiceMode, ToolSpec
from voicert.engine.clients.chat_upstream import (
    StreamReader,
    UpstreamError,
    fit_messages,
    request_body,
    sse_data,
)

WEATHER = ToolSpec.of(
    "get_weather",
    "The weather in a city.",
    {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
)


def chunk(delta=None, finish=None, usage=None) -> str:
    body = {
        "id": "c1",
        "object": "chat.completion.chunk",
        "model": "m",
        "choices": []
        if delta is None and finish is None
        else [{"index": 0, "delta": delta or {}, "finish_reason": finish}],
    }
    if usage is not None:
        body["usage"] = usage
    return json.dumps(body)


def call_delta(index, name=None, args=None, call_id=None) -> dict:
    fn = {}
    if name is not None:
        fn["name"] = name
    if args is not None:
        fn["arguments"] = args
    d = {"index": index, "function": fn}
    if call_id:
        d.update(id=call_id, type="function")
    return {"tool_calls": [d]}


def test_the_body_writes_history_with_calls_and_results_in_the_openai_shape():
    history = [
        ChatMessage("system", "Be brief."),
        ChatMessage("user", "Weather in Oslo?"),
        ChatMessage("assistant", "", (ToolCall("call_1", "get_weather", '{"city": "Oslo"}'),)),
        ChatMessage("tool", '{"temp": 3}', tool_call_id="call_1"),
    ]
    body = request_body(
        "m", history, 64, (WEATHER,), ToolChoice(ToolChoiceMode.NAMED, "get_weather"), False
    )
    assert body["messages"][2] == {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'},
            }
        ],
    }
    assert body["messages"][3] == {
        "role": "tool",
        "tool_call_id": "call_1",
        "content": '{"temp": 3}',
    }
    assert body["tools"] == [WEATHER.openai()]
    assert body["tool_choice"] == {"type": "function", "function": {"name": "get_weather"}}
    assert body["parallel_tool_calls"] is False
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert body["max_tokens"] == 64


def test_the_same_conversation_gives_the_same_bytes_every_turn():
    """The server's prefix cache hits only on a byte-identical prefix."""
    turn1 = [ChatMessage("system", "Be brief."), ChatMessage("user", "Hi")]
    turn2 = [*turn1, ChatMessage("assistant", "Hello!"), ChatMessage("user", "And you?")]
    a = json.dumps(request_body("m", turn1, 64, (WEATHER,)))
    b = json.dumps(request_body("m", turn2, 64, (WEATHER,)))
    assert json.dumps(request_body("m", turn1, 64, (WEATHER,))) == a
    head = a[: a.index('{"role": "user", "content": "Hi"}') + 30]
    assert b.startswith(head)


def test_a_body_without_tools_names_none():
    body = request_body("m", [ChatMessage("user", "Hi")], 8)
    assert "tools" not in body and "tool_choice" not in body


def test_a_long_conversation_loses_its_oldest_turns_but_keeps_the_system_prompt():
    msgs = [ChatMessage("system", "S" * 50)]
    for i in range(10):
        msgs += [ChatMessage("user", f"q{i} " + "x" * 100), ChatMessage("assistant", "y" * 100)]
    cut = fit_messages(msgs, 800)
    assert cut[0] == msgs[0]
    assert cut[1].role == "user" and cut[-1] == msgs[-1]
    assert sum(len(m.content) + 16 for m in cut) <= 800
    assert fit_messages(msgs, 10**6) == msgs


def test_a_tool_result_never_loses_its_call():
    call = ToolCall("c1", "f", "{}")
    msgs = [
        ChatMessage("system", "s"),
        ChatMessage("user", "a" * 500),
        ChatMessage("assistant", "", (call,)),
        ChatMessage("tool", "out", tool_call_id="c1"),
        ChatMessage("user", "now"),
    ]
    cut = fit_messages(msgs, 100)
    assert [m.role for m in cut] == ["system", "user"] and cut[1].content == "now"


def test_sse_lines():
    assert sse_data('data: {"a": 1}') == '{"a": 1}'
    assert sse_data("data:[DONE]") == "[DONE]"
    assert sse_data(": keep-alive") is None and sse_data("") is None
    assert sse_data("event: x") is None


def test_text_deltas_usage_and_the_end():
    r = StreamReader()
    assert r.feed(chunk({"role": "assistant", "content": ""})) == ""
    assert r.feed(chunk({"content": "Hel"})) == "Hel"
    assert r.feed(chunk({"content": "lo"})) == "lo"
    assert r.feed(chunk(finish="stop")) == ""
    assert (
        r.feed(chunk(usage={"prompt_tokens": 12, "completion_tokens": 2, "total_tokens": 14})) == ""
    )
    assert r.feed("[DONE]") == "" and r.done
    assert (r.finish_reason, r.prompt_tokens, r.completion_tokens, r.chunks) == ("stop", 12, 2, 2)


def test_an_error_mid_stream_or_garbage_is_an_upstream_error():
    with pytest.raises(UpstreamError, match="overloaded"):
        StreamReader().feed(json.dumps({"error": {"message": "overloaded", "type": "x"}}))
    with pytest.raises(UpstreamError, match="not a JSON"):
        StreamReader().feed("<html>")


def _parse(texts: list[str]) -> list:
    parser = tc.CallParser()
    pieces = []
    for t in texts:
        pieces += parser.feed(t)
    return pieces + parser.close()


def test_streamed_tool_calls_reach_the_call_parser_as_calls_with_argument_deltas():
    r = StreamReader()
    texts = [
        r.feed(chunk({"content": "Let me check."})),
        r.feed(chunk(call_delta(0, "get_weather", "", "call_a"))),
        r.feed(chunk(call_delta(0, args='{"city": '))),
        r.feed(chunk(call_delta(0, args='"Oslo"}'))),
        r.feed(chunk(call_delta(1, "get_weather", '{"city": "Rome"}', "call_b"))),
        r.feed(chunk(finish="tool_calls")),
        r.feed("[DONE]"),
    ]
    pieces = _parse(texts)
    said = "".join(p.text for p in pieces if isinstance(p, tc.Said))
    closed = [p for p in pieces if isinstance(p, tc.CallClosed)]
    assert said.strip() == "Let me check."
    assert [(c.name, json.loads(c.arguments)) for c in closed] == [
        ("get_weather", {"city": "Oslo"}),
        ("get_weather", {"city": "Rome"}),
    ]
    args = [p.delta for p in pieces if isinstance(p, tc.CallArgs) and p.index == 0]
    assert len(args) >= 2  # the arguments arrive as they are decoded, not at the end
    assert r.finish_reason == "tool_calls"


def test_a_call_without_arguments_and_arguments_before_the_name():
    r = StreamReader()
    texts = [
        r.feed(chunk(call_delta(0, "now", call_id="c0"))),
        r.feed(chunk(call_delta(1, args='{"city"'))),
        r.feed(chunk(call_delta(1, "get_weather", ': "Oslo"}'))),
        r.close(),
    ]
    closed = [p for p in _parse(texts) if isinstance(p, tc.CallClosed)]
    assert [(c.name, json.loads(c.arguments)) for c in closed] == [
        ("now", {}),
        ("get_weather", {"city": "Oslo"}),
    ]
