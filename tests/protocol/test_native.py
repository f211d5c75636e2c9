import base64
import json
import re

import msgpack
import pytest

from voicert.protocol import native as p


@pytest.mark.parametrize("binary", [True, False])
def test_client_events_round_trip_in_both_frame_kinds(binary):
    events = [
        p.SessionStart(
            sample_rate=24000,
            encoding="f32",
            system_prompt="hi",
            turn_detection="manual",
            max_new_tokens=12,
        ),
        p.Audio(b"\x00\x01\x02\x03"),
        p.AudioCommit(),
        p.ResponseCancel(),
        p.SessionEnd(),
    ]
    for ev in events:
        frame = p.encode(ev, binary)
        assert isinstance(frame, bytes if binary else str)
        assert p.decode_client(frame) == ev


def test_json_audio_is_base64():
    frame = p.encode(p.Audio(b"\xff\x00"), binary=False)
    assert json.loads(frame)["audio"] == base64.b64encode(b"\xff\x00").decode()


def test_session_start_defaults():
    ev = p.decode_client(msgpack.packb({"type": "session.start"}))
    assert ev == p.SessionStart()


@pytest.mark.parametrize(
    "frame, code",
    [
        (b"\xc1\xc1garbage", p.ErrorCode.MALFORMED),
        ("{not json", p.ErrorCode.MALFORMED),
        (msgpack.packb([1, 2]), p.ErrorCode.MALFORMED),
        (msgpack.packb({"no": "type"}), p.ErrorCode.INVALID),
        (msgpack.packb({"type": "audio.explode"}), p.ErrorCode.UNKNOWN_TYPE),
        (msgpack.packb({"type": "audio"}), p.ErrorCode.INVALID),
        (msgpack.packb({"type": "audio", "audio": "text"}), p.ErrorCode.INVALID),
        (json.dumps({"type": "audio", "audio": "%%%"}), p.ErrorCode.INVALID),
        (msgpack.packb({"type": "session.start", "sample_rate": "16k"}), p.ErrorCode.INVALID),
        (msgpack.packb({"type": "session.start", "sample_rate": True}), p.ErrorCode.INVALID),
        (
            msgpack.packb({"type": "session.start", "protocol_version": 2}),
            p.ErrorCode.UNSUPPORTED_VERSION,
        ),
        (
            msgpack.packb({"type": "session.start", "options": {"turn_detection": "x"}}),
            p.ErrorCode.INVALID,
        ),
        (
            msgpack.packb({"type": "session.start", "options": {"max_new_tokens": 0}}),
            p.ErrorCode.INVALID,
        ),
    ],
)
def test_bad_frames_raise_typed_errors(frame, code):
    with pytest.raises(p.ProtocolError) as info:
        p.decode_client(frame)
    assert info.value.code is code


def test_unknown_type_message_is_bounded():
    with pytest.raises(p.ProtocolError) as info:
        p.decode_client(msgpack.packb({"type": "x" * 10000}))
    assert len(info.value.message) < 400


def test_server_events_encode_with_type_first_and_decode():
    ev = p.TurnLatency(3, {"ttft_ms": 12.5})
    for binary in (True, False):
        msg = p.decode_server(p.encode(ev, binary))
        assert msg == {
            "type": "turn.latency",
            "turn_id": 3,
            "stages": {"ttft_ms": 12.5},
            "early_asr": False,
            "early_prefill": False,
        }
    assert next(iter(msgpack.unpackb(p.encode(p.Error("bad_audio", "m"))))) == "type"


def test_tools_travel_in_session_start_and_session_update_and_results_come_back():
    from voicert.core.chat import ToolChoice, ToolChoiceMode, ToolSpec

    weather = ToolSpec.of(
        "weather", "Weather now", {"type": "object", "properties": {"city": {"type": "string"}}}
    )
    named = ToolChoice(ToolChoiceMode.NAMED, "weather")
    for binary in (True, False):
        for ev in (
            p.SessionStart(tools=(weather,), tool_choice=named),
            p.SessionUpdate(tools=(), tool_choice=ToolChoice(ToolChoiceMode.NONE)),
            p.SessionUpdate(system_prompt="Be brief."),
            p.ToolResultIn("call_1", '{"t": 21}', respond=False),
        ):
            assert p.decode_client(p.encode(ev, binary)) == ev
    # the OpenAI shapes are read too; an object output is sent on as its JSON
    start = p.decode_client(
        json.dumps(
            {
                "type": "session.start",
                "options": {
                    "tools": [{"type": "function", "function": {"name": "weather"}}],
                    "tool_choice": "required",
                },
            }
        )
    )
    assert start.tools[0].name == "weather" and start.tool_choice.mode is ToolChoiceMode.REQUIRED
    result = p.decode_client(
        json.dumps({"type": "tool.result", "call_id": "c", "output": {"a": 1}})
    )
    assert result.output == '{"a": 1}'


@pytest.mark.parametrize(
    "msg",
    [
        {"type": "session.start", "options": {"tools": {"name": "x"}}},
        {"type": "session.start", "options": {"tools": [{"name": "bad name"}]}},
        {"type": "session.start", "options": {"tool_choice": "maybe"}},
        {"type": "session.update", "tools": [{"name": "f", "parameters": [1]}]},
        {
            "type": "session.update",
            "tools": [
                {
                    "name": "f",
                    "parameters": {"type": "object", "properties": {"x": {"$ref": "#/nowhere"}}},
                }
            ],
        },
        {
            "type": "session.start",
            "options": {
                "tools": [
                    {
                        "name": "f",
                        "parameters": {"type": "object", "properties": {"x": {"type": "strin"}}},
                    }
                ]
            },
        },
        {"type": "tool.result", "output": "x"},
        {"type": "tool.result", "call_id": "c"},
    ],
)
def test_bad_tools_and_results_are_invalid_messages(msg):
    with pytest.raises(p.ProtocolError) as info:
        p.decode_client(json.dumps(msg))
    assert info.value.code is p.ErrorCode.INVALID


@pytest.mark.parametrize(
    "msg",
    [
        {
            "type": "session.start",
            "options": {
                "tools": [
                    {"name": "f", "parameters": {"type": "object", "properties": {"a": b"x"}}}
                ]
            },
        },
        {"type": "tool.result", "call_id": "c", "output": b"\x00\x01"},
        {"type": "tool.result", "call_id": "c", "output": {"rows": [b"x"]}},
        {"type": "tool.result", "call_id": "c", "output": {"x": float("nan")}},
    ],
    ids=["bin-in-a-schema", "bin-output", "bin-in-an-output", "nan-in-an-output"],
)
def test_msgpack_values_json_cannot_carry_are_invalid_messages_not_internal_errors(msg):
    """msgpack has bin values (and NaN) that JSON has no word for: a TypeError escaped the codec
    and closed the session with 1011 internal_error."""
    with pytest.raises(p.ProtocolError) as info:
        p.decode_client(msgpack.packb(msg, use_bin_type=True))
    assert info.value.code is p.ErrorCode.INVALID


def test_tool_events_go_out_from_the_core_events():
    from voicert.core import events as ev

    sent = [
        p.decode_server(p.encode(p.from_core(e)))
        for e in (
            ev.ToolCallStarted(2, "call_1", "weather", "item_3"),
            ev.ToolCallArguments(2, "call_1", '{"city"'),
            ev.ToolCallDone(2, "call_1", "weather", '{"city": "Oslo"}', "item_3", False),
            ev.ToolResult(2, "call_1", "cold", "item_4"),
            ev.ReplyDone(2, "Let me look.", 9, 40, ev.ReplyEnd.STOP, "item_2", ("call_1",)),
        )
    ]
    assert [m["type"] for m in sent] == [
        "tool.call.started",
        "tool.call.delta",
        "tool.call",
        "tool.output",
        "response.done",
    ]
    assert sent[2] == {
        "type": "tool.call",
        "turn_id": 2,
        "call_id": "call_1",
        "name": "weather",
        "arguments": '{"city": "Oslo"}',
        "server": False,
    }
    assert sent[4]["tool_calls"] == ["call_1"]


def test_turn_taking_options_travel_in_session_start_and_unknown_options_are_refused():
    start = p.decode_client(
        json.dumps(
            {
                "type": "session.start",
                "options": {"end_of_turn": "silence", "silence_ms": 700, "vad_threshold": 0.6},
            }
        )
    )
    assert (start.end_of_turn, start.silence_ms, start.vad_threshold) == ("silence", 700, 0.6)
    plain = p.decode_client(json.dumps({"type": "session.start"}))
    assert (plain.end_of_turn, plain.silence_ms, plain.vad_threshold) == (None, None, None)
    for options, said in (
        ({"end_of_turn": "psychic"}, "end_of_turn must be one of"),
        ({"silence_ms": 5}, "silence_ms must be in [32, 10000]"),
        ({"vad_threshold": 1.5}, "vad_threshold must be in (0, 1)"),
        ({"silense_ms": 700}, "options: unknown silense_ms"),
    ):
        with pytest.raises(p.ProtocolError, match=re.escape(said)) as err:
            p.decode_client(json.dumps({"type": "session.start", "options": options}))
        assert err.value.code == p.ErrorCode.INVALID


def test_a_session_start_encoded_by_the_codec_decodes_to_the_same_options():
    start = p.SessionStart(
        end_of_turn="silence",
        silence_ms=700,
        vad_threshold=0.6,
        voice="en-us+f3",
        output_audio=p.OutputAudio("pcm16", 24000),
    )
    for binary in (True, False):
        back = p.decode_client(p.encode(start, binary=binary))
        assert back == start
    assert p.decode_client(p.encode(p.SessionStart())) == p.SessionStart()


def test_the_voice_travels_in_session_start_and_session_update():
    start = p.decode_client(json.dumps({"type": "session.start", "options": {"voice": "en"}}))
    assert start.voice == "en"
    update = p.decode_client(json.dumps({"type": "session.update", "voice": "en-us+f3"}))
    assert update.voice == "en-us+f3" and update.tools is None and update.system_prompt is None
    assert p.decode_client(p.encode(p.SessionUpdate(voice="en"))).voice == "en"
    with pytest.raises(p.ProtocolError, match="field 'voice' must be str"):
        p.decode_client(json.dumps({"type": "session.update", "voice": 3}))


def test_a_final_transcript_carries_the_language_the_recogniser_heard():
    from voicert.core import events as ev
    from voicert.protocol import native

    wire = native.decode_server(
        native.encode(native.from_core(ev.TranscriptFinal(3, "Bonjour", "item_1", "fr")))
    )
    assert wire == {"type": "transcript.final", "turn_id": 3, "text": "Bonjour", "language": "fr"}


def test_sampling_options_round_trip_and_are_refused_without_a_temperature():
    start = p.SessionStart(temperature=0.7, top_p=0.9, top_k=40, seed=7)
    for binary in (True, False):
        assert p.decode_client(p.encode(start, binary)) == start
    for options, named in (
        ({"top_p": 0.9}, "options.top_p"),  # would change nothing on a greedy reply: said
        ({"temperature": 0, "seed": 3}, "options.seed"),
        ({"temperature": 0.7, "top_p": 0}, "options.top_p"),
        ({"temperature": 0.7, "top_k": -1}, "options.top_k"),
        ({"temperature": 0.7, "top_k": 1.5}, "top_k"),
        ({"temperature": 0.7, "seed": True}, "seed"),
    ):
        with pytest.raises(p.ProtocolError) as info:
            p.decode_client(json.dumps({"type": "session.start", "options": options}))
        assert named in str(info.value), (options, str(info.value))
