"""Realtime codec pieces: item events, and session fields that are refused rather than ignored."""

import json

import pytest

from voicert.protocol import realtime as rt


def decode(**msg):
    return rt.decode_client(json.dumps(msg))[0]


def test_item_events_decode_to_typed_events():
    assert decode(
        type="conversation.item.truncate", item_id="i", content_index=0, audio_end_ms=1500
    ) == rt.ItemTruncate("i", 0, 1500)
    assert decode(type="conversation.item.delete", item_id="i") == rt.ItemDelete("i")
    assert decode(type="conversation.item.retrieve", item_id="i") == rt.ItemRetrieve("i")


@pytest.mark.parametrize(
    "msg, param",
    [
        ({"type": "conversation.item.truncate", "content_index": 0, "audio_end_ms": 1}, "item_id"),
        (
            {"type": "conversation.item.truncate", "item_id": "i", "content_index": 0},
            "audio_end_ms",
        ),
        (
            {
                "type": "conversation.item.truncate",
                "item_id": "i",
                "content_index": 0,
                "audio_end_ms": -5,
            },
            "audio_end_ms",
        ),
        (
            {
                "type": "conversation.item.truncate",
                "item_id": "i",
                "content_index": "0",
                "audio_end_ms": 5,
            },
            "content_index",
        ),
        ({"type": "conversation.item.delete", "item_id": 7}, "item_id"),
        ({"type": "conversation.item.retrieve"}, "item_id"),
    ],
)
def test_bad_item_events_name_the_parameter(msg, param):
    with pytest.raises(rt.RealtimeError) as info:
        rt.decode_client(json.dumps(msg))
    assert info.value.param == param


CFG = rt.SessionConfig(instructions="x")


@pytest.mark.parametrize(
    "session, param",
    [
        ({"tools": [{"type": "mcp", "server_label": "f"}]}, "session.tools[0].type"),
        ({"tools": [{"type": "function", "name": "f"}, {"name": "f"}]}, "session.tools[1].name"),
        (
            {"tools": [{"type": "function", "name": "f", "parameters": {"type": "array"}}]},
            "session.tools[0].parameters",
        ),
        (
            {
                "tools": [
                    {
                        "type": "function",
                        "name": "f",
                        "parameters": {
                            "type": "object",
                            "properties": {"x": {"$ref": "#/nowhere"}},
                        },
                    }
                ]
            },
            "session.tools[0].parameters",
        ),
        ({"tool_choice": "sometimes"}, "session.tool_choice"),
        ({"prompt": {"id": "pmpt_1"}}, "session.prompt"),
        ({"speed": 1.5}, "session.speed"),
        (
            {"input_audio_noise_reduction": {"type": "near_field"}},
            "session.input_audio_noise_reduction",
        ),
        (
            {"audio": {"input": {"noise_reduction": {"type": "far_field"}}}},
            "session.audio.input.noise_reduction",
        ),
        ({"audio": {"output": {"speed": 2}}}, "session.audio.output.speed"),
        ({"audio": {"output": {"pitch": 2}}}, "session.audio.output.pitch"),
        ({"colour": "blue"}, "session.colour"),
        ({"voice": 3}, "session.voice"),
    ],
)
def test_session_fields_asking_for_what_voicert_does_not_do_are_refused(session, param):
    with pytest.raises(rt.RealtimeError) as info:
        rt.update_session(CFG, session)
    assert info.value.param == param


def test_tools_and_tool_choice_are_read_in_every_shape_and_written_back_flat():
    from voicert.core.chat import ToolChoiceMode

    cfg = rt.update_session(
        CFG,
        {
            "tools": [
                {"type": "function", "name": "a", "parameters": {"type": "object"}},
                {"type": "function", "function": {"name": "b", "description": "B"}},
            ],
            "tool_choice": {"type": "function", "name": "b"},
        },
    )
    assert [t.name for t in cfg.tools] == ["a", "b"]
    assert cfg.tool_choice.mode is ToolChoiceMode.NAMED and cfg.tool_choice.name == "b"
    wire = cfg.to_wire(rt.Flavor.GA, "s", "m")
    assert wire["tools"][1] == {
        "type": "function",
        "name": "b",
        "description": "B",
        "parameters": {"type": "object", "properties": {}},
    }
    assert wire["tool_choice"] == {"type": "function", "name": "b"}


def test_neutral_values_of_unimplemented_fields_are_accepted():
    cfg = rt.update_session(
        CFG,
        {
            "type": "realtime",
            "model": "m",
            "tools": [],
            "tool_choice": "auto",
            "tracing": "auto",
            "speed": 1.0,
            "include": [],
            "prompt": None,
            "voice": "alloy",
        },
    )
    assert cfg.voice == "alloy"


def test_semantic_vad_parses_with_its_eagerness_and_goes_back_on_the_wire_in_its_own_shape():
    cfg = rt.update_session(
        CFG,
        {"turn_detection": {"type": "semantic_vad", "eagerness": "low", "create_response": False}},
    )
    td = cfg.turn_detection
    assert (td.type, td.eagerness, td.create_response) == ("semantic_vad", "low", False)
    assert td.to_wire() == {
        "type": "semantic_vad",
        "eagerness": "low",
        "create_response": False,
        "interrupt_response": True,
    }
    back = rt.update_session(
        cfg, {"turn_detection": {"type": "server_vad", "silence_duration_ms": 300}}
    )
    assert back.turn_detection.type == "server_vad"
    assert back.turn_detection.silence_duration_ms == 300 and back.turn_detection.create_response


@pytest.mark.parametrize(
    "td, param",
    [
        ({"type": "semantic_vad", "eagerness": "eager"}, "session.turn_detection.eagerness"),
        (
            {"type": "semantic_vad", "silence_duration_ms": 300},
            "session.turn_detection.silence_duration_ms",
        ),
        ({"type": "server_vad", "eagerness": "low"}, "session.turn_detection.eagerness"),
        ({"type": "server_vad", "idle_timeout_ms": 5000}, "session.turn_detection.idle_timeout_ms"),
        ({"type": "other_vad"}, "session.turn_detection.type"),
    ],
)
def test_turn_detection_fields_that_do_not_apply_are_refused_by_name(td, param):
    with pytest.raises(rt.RealtimeError) as info:
        rt.update_session(CFG, {"turn_detection": td})
    assert info.value.param == param


def test_a_session_temperature_is_taken_and_echoed_and_out_of_range_refused():
    cfg = rt.update_session(CFG, {"temperature": 1.1})
    assert cfg.temperature == 1.1
    assert cfg.to_wire(rt.Flavor.BETA, "s", "m")["temperature"] == 1.1
    assert CFG.temperature is None  # absent: greedy
    for bad in (3, -1, "hot", True):
        with pytest.raises(rt.RealtimeError) as info:
            rt.update_session(CFG, {"temperature": bad})
        assert info.value.param == "session.temperature"
