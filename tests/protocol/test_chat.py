"""The chat completions codec: what a body asks for, what it is refused for, stop strings."""

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from voicert.protocol import chat


def parse(**body):
    body.setdefault("model", "m")
    body.setdefault("messages", [{"role": "user", "content": "hi"}])
    return chat.parse_request(json.dumps(body).encode(), max_text_chars=1000)


def refused(**body) -> chat.ChatError:
    with pytest.raises(chat.ChatError) as info:
        parse(**body)
    return info.value


def test_a_plain_request_maps_roles_and_text_parts():
    req = parse(
        messages=[
            {"role": "developer", "content": "be brief"},
            {
                "role": "user",
                "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
            },
            {"role": "assistant", "content": "ok", "name": "bot"},
        ],
        max_completion_tokens=7,
        stream=True,
        stream_options={"include_usage": True},
        stop="\n",
        temperature=0,
        n=1,
        seed=3,
        user="u",
    )
    assert [(m.role, m.content) for m in req.messages] == [
        ("system", "be brief"),
        ("user", "ab"),
        ("assistant", "ok"),
    ]
    assert (req.max_tokens, req.stream, req.include_usage, req.stop) == (7, True, True, ("\n",))
    assert req.id.startswith("chatcmpl-")


def test_tools_and_a_tool_conversation_are_read():
    req = parse(
        tools=[
            {
                "type": "function",
                "function": {
                    "name": "weather",
                    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
                },
            }
        ],
        tool_choice="required",
        parallel_tool_calls=False,
        messages=[
            {"role": "user", "content": "weather?"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "weather", "arguments": '{"city": "Oslo"}'},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "call_1", "content": "cold"},
        ],
    )
    assert [t.name for t in req.tools] == ["weather"] and not req.parallel_tool_calls
    assert req.tool_choice.mode.value == "required"
    assert req.messages[1].tool_calls[0].arguments == '{"city": "Oslo"}'
    assert (req.messages[2].role, req.messages[2].tool_call_id) == ("tool", "call_1")


@pytest.mark.parametrize(
    "body, param, code",
    [
        ({"temperature": 2.5}, "temperature", "invalid_value"),
        ({"temperature": "hot"}, "temperature", "invalid_value"),
        ({"seed": 1.5}, "seed", "invalid_value"),
        ({"top_k": 2.5}, "top_k", "invalid_value"),
        ({"top_k": -2}, "top_k", "invalid_value"),
        ({"top_p": 0}, "top_p", "invalid_value"),
        ({"n": 2}, "n", "unsupported_value"),
        ({"presence_penalty": 0.5}, "presence_penalty", "unsupported_value"),
        ({"top_p": True}, "top_p", "invalid_value"),
        ({"tools": {}}, "tools", "invalid_value"),
        (
            {"tools": [{"type": "function", "function": {"name": "a b"}}]},
            "tools[0].name",
            "invalid_value",
        ),
        (
            {"tool_choice": {"type": "function", "function": {"name": "f"}}},
            "tool_choice",
            "invalid_value",
        ),
        ({"parallel_tool_calls": "yes"}, "parallel_tool_calls", "invalid_value"),
        ({"logprobs": True}, "logprobs", "unsupported_value"),
        ({"top_logprobs": 2}, "top_logprobs", "unsupported_value"),
        ({"response_format": {"type": "json_object"}}, "response_format", "unsupported_value"),
        ({"logit_bias": {"50256": -100}}, "logit_bias", "unsupported_value"),
        ({"logprobs": "false"}, "logprobs", "unsupported_value"),
        ({"max_tokens": 0}, "max_tokens", "invalid_value"),
        ({"max_tokens": "5"}, "max_tokens", "invalid_value"),
        ({"stream": "yes"}, "stream", "invalid_value"),
        ({"stream_options": {"include_usage": True}}, "stream_options", "invalid_value"),
        ({"stop": ["a"] * 5}, "stop", "invalid_value"),
        ({"stop": [""]}, "stop", "invalid_value"),
        ({"model": ""}, "model", "invalid_value"),
        ({"messages": []}, "messages", "invalid_value"),
        (
            {"messages": [{"role": "tool", "content": "x"}]},
            "messages[0].tool_call_id",
            "invalid_value",
        ),
        (
            {"messages": [{"role": "function", "content": "x"}]},
            "messages[0].role",
            "unsupported_value",
        ),
        (
            {
                "messages": [
                    {
                        "role": "assistant",
                        "tool_calls": [{"id": "c", "function": {"name": "f", "arguments": "[1]"}}],
                    }
                ]
            },
            "messages[0].tool_calls[0].function.arguments",
            "invalid_value",
        ),
        (
            {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
            "messages[0].content",
            "unsupported_value",
        ),
        (
            {"messages": [{"role": "user", "content": "x" * 1001}]},
            "messages[0].content",
            "string_above_max_length",
        ),
        (
            {"messages": [{"role": "user", "content": "x", "tool_calls": []}]},
            "messages[0].tool_calls",
            "unsupported_parameter",
        ),
    ],
)
def test_what_voicert_would_not_honour_is_refused_with_the_parameter_named(body, param, code):
    err = refused(**body)
    assert (err.status, err.param, err.code) == (400, param, code)
    assert err.body()["error"]["type"] == "invalid_request_error"


@pytest.mark.parametrize("raw", [b"", b"{", b"[]", b"\xff", b"[" * 100000])
def test_a_body_that_is_not_a_json_object_is_refused(raw):
    with pytest.raises(chat.ChatError) as info:
        chat.parse_request(raw, 1000)
    assert info.value.status == 400


def test_a_stop_string_split_across_deltas_is_cut_and_never_sent():
    m = chat.StopMatcher(("STOP",))
    assert m.push("hello ST") == ("hello ", False)  # "ST" could begin the stop string
    assert m.push("OP and more") == ("", True)


def test_held_back_text_that_did_not_become_a_stop_string_is_sent_later():
    m = chat.StopMatcher(("\n\n",))
    assert m.push("one\n") == ("one", False)
    assert m.push("two") == ("\ntwo", False)
    assert m.push("!\n") == ("!", False)
    assert m.flush() == "\n"


@given(
    st.text(alphabet="ab\n", max_size=40),
    st.lists(st.integers(1, 5), max_size=20),
    st.lists(st.text(alphabet="ab\n", min_size=1, max_size=3), min_size=1, max_size=3),
)
def test_streamed_output_is_the_text_cut_where_a_stop_string_first_appeared(text, cuts, stops):
    """The reply ends with the first delta after which the text holds a stop string; what was
    sent is that text up to the stop string's earliest occurrence, and nothing after it."""
    m = chat.StopMatcher(tuple(stops))
    out, pos, want = [], 0, None
    for n in [*cuts, len(text)]:
        piece, hit = m.push(text[pos : pos + n])
        out.append(piece)
        pos += n
        found = [i for i in (text[:pos].find(s) for s in stops) if i >= 0]
        assert hit == bool(found)
        if found:
            want = text[: min(found)]
            break
        if pos >= len(text):
            break
    if want is None:
        out.append(m.flush())
        want = text
    assert "".join(out) == want


def test_a_huge_stop_string_costs_linear_work_not_quadratic():
    """A 400,000-character stop string (the body limit allows it) with a reply that keeps
    almost matching it: the old suffix scan took minutes per delta on the event loop. The bound
    is 100x what the linear matcher needs on a busy 2-core machine, and far below the old one."""
    import time

    stop = "ab" * 200_000
    m = chat.StopMatcher((stop,))
    t0 = time.perf_counter()
    sent = "".join(m.push("ab" * 50)[0] for _ in range(100))
    assert sent == "" and len(m.held) == 10_000  # all of it could still become the stop string
    assert m.push("x") == ("ab" * 5_000 + "x", False)
    assert time.perf_counter() - t0 < 30


def test_temperature_top_p_and_seed_ask_for_sampling():
    from voicert.core.llm import GREEDY, Sampling

    assert parse(temperature=0.7, top_p=0.9, seed=7).sampling == Sampling(0.7, 0.9, 0, 7)
    # top_k: vLLM's and SGLang's extension (the SDK's extra_body); -1 is their "all"
    assert parse(temperature=0.7, top_k=20).sampling == Sampling(0.7, 1.0, 20)
    assert parse(temperature=0.7, top_k=-1).sampling == Sampling(0.7, 1.0, 0)
    assert parse().sampling == GREEDY
    assert parse(temperature=0, seed=3).sampling.greedy


@pytest.mark.parametrize(
    "defaults",
    [
        {"logprobs": False},
        {"logprobs": None, "top_logprobs": None},
        {"response_format": {"type": "text"}},
        {"logit_bias": {}},
        {"logit_bias": None, "response_format": None},
    ],
)
def test_openais_documented_defaults_sent_explicitly_are_accepted(defaults):
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], **defaults}
    assert chat.parse_request(json.dumps(body).encode(), 1000).messages[0].content == "hi"
