"""Every door's codec under arbitrary input (hypothesis): any frame decodes to an event or raises
that codec's one error type, never another exception. Type-confused fields are named in the error."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from voicert.protocol import native as p
from voicert.protocol import realtime as rt
from voicert.protocol import twilio as tw

FUZZ = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=20),
)
json_values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=12), inner, max_size=5)
    ),
    max_leaves=20,
)


def messages(type_key: str, types: tuple[str, ...]):
    """Maps with a known (or random) type and random fields, some under the known field names."""
    known = [
        "audio",
        "text",
        "respond",
        "sample_rate",
        "encoding",
        "system_prompt",
        "options",
        "session",
        "item",
        "response",
        "start",
        "media",
        "mark",
        "dtmf",
        "stop",
        "mediaFormat",
        "customParameters",
        "tracks",
        "payload",
        "turn_detection",
    ]
    return st.builds(
        lambda kind, fields, extra: {type_key: kind, **fields, **extra},
        st.one_of(st.sampled_from(types), st.text(max_size=10), scalars),
        st.dictionaries(st.sampled_from(known), json_values, max_size=4),
        st.dictionaries(st.text(max_size=8), json_values, max_size=2),
    )


def deep(n: int) -> str:
    return "[" * n + "]" * n


@FUZZ
@given(st.one_of(messages("type", p.CLIENT_TYPES), json_values))
def test_native_json_frames_decode_or_raise_protocol_error(msg):
    try:
        p.decode_client(json.dumps(msg))
    except p.ProtocolError:
        pass


@FUZZ
@given(st.binary(max_size=200))
def test_native_binary_frames_decode_or_raise_protocol_error(data):
    try:
        p.decode_client(data)
    except p.ProtocolError:
        pass


@FUZZ
@given(st.one_of(messages("type", rt.CLIENT_TYPES), json_values, st.binary(max_size=50)))
def test_realtime_frames_decode_or_raise_realtime_error(msg):
    frame = msg if isinstance(msg, bytes) else json.dumps(msg)
    try:
        rt.decode_client(frame)
    except rt.RealtimeError:
        pass


turn_detection = st.one_of(
    json_values,
    st.dictionaries(
        st.sampled_from(
            [
                "type",
                "threshold",
                "prefix_padding_ms",
                "silence_duration_ms",
                "create_response",
                "interrupt_response",
            ]
        ),
        json_values,
        max_size=6,
    ),
)
session_maps = st.dictionaries(
    st.sampled_from(
        [
            "instructions",
            "modalities",
            "output_modalities",
            "input_audio_format",
            "output_audio_format",
            "turn_detection",
            "input_audio_transcription",
            "max_response_output_tokens",
            "max_output_tokens",
            "voice",
            "audio",
        ]
    ),
    st.one_of(
        json_values,
        turn_detection,
        st.fixed_dictionaries(
            {},
            optional={
                "input": st.one_of(
                    json_values,
                    st.fixed_dictionaries(
                        {}, optional={"format": json_values, "turn_detection": turn_detection}
                    ),
                ),
                "output": json_values,
            },
        ),
    ),
    max_size=5,
)


@FUZZ
@given(session_maps)
def test_realtime_session_update_applies_with_right_types_or_raises(changes):
    try:
        cfg = rt.update_session(rt.SessionConfig(instructions="x"), changes)
    except rt.RealtimeError:
        return
    td = cfg.turn_detection
    if td is not None:  # whatever was accepted has the types the session core relies on
        assert isinstance(td.threshold, float) and 0 < td.threshold < 1
        assert type(td.prefix_padding_ms) is int and type(td.silence_duration_ms) is int
        assert type(td.create_response) is bool and type(td.interrupt_response) is bool
    assert isinstance(cfg.instructions, str) and cfg.input_format in rt.BETA_FORMATS


@FUZZ
@given(
    st.one_of(
        messages("event", ("connected", "start", "media", "mark", "dtmf", "stop")), json_values
    )
)
def test_twilio_frames_decode_or_raise_twilio_error(msg):
    try:
        event = tw.decode_inbound(json.dumps(msg))
    except tw.TwilioError:
        return
    if isinstance(event, tw.Start):  # what the session core reads is typed as declared
        assert all(isinstance(v, str) for v in event.custom_parameters.values())
        assert all(isinstance(t, str) for t in event.tracks)


@pytest.mark.parametrize(
    "frame",
    [
        '{"type":"session.update","session":{"turn_detection":{"threshold":"abc"}}}',
        '{"type":"session.update","session":{"turn_detection":{"threshold":[0.5]}}}',
        '{"type":"session.update","session":{"turn_detection":{"silence_duration_ms":"abc"}}}',
        '{"type":"session.update","session":{"turn_detection":{"prefix_padding_ms":300.5}}}',
        '{"type":"session.update","session":{"turn_detection":{"create_response":"yes"}}}',
        '{"type":"session.update","session":{"audio":{"input":"pcm16"}}}',
        '{"type":"session.update","session":{"audio":5}}',
    ],
)
def test_realtime_type_confusion_is_a_typed_error_naming_the_field(frame):
    event, _ = rt.decode_client(frame)
    with pytest.raises(rt.RealtimeError) as err:
        rt.update_session(rt.SessionConfig(instructions="x"), event.session)
    assert err.value.param and err.value.param.startswith("session.")


def test_a_whole_float_is_taken_as_an_integer():
    cfg = rt.update_session(
        rt.SessionConfig(instructions="x"), {"turn_detection": {"prefix_padding_ms": 300.0}}
    )
    assert cfg.turn_detection.prefix_padding_ms == 300
    assert type(cfg.turn_detection.prefix_padding_ms) is int


@pytest.mark.parametrize(
    "start",
    [
        {"customParameters": {"system_prompt": 123}},
        {"customParameters": "abc"},
        {"tracks": 5},
        {"tracks": [1, 2]},
    ],
)
def test_twilio_start_with_wrong_types_is_refused(start):
    body = {
        "streamSid": "MZ1",
        "callSid": "CA1",
        "tracks": ["inbound"],
        "customParameters": {},
        "mediaFormat": {"encoding": tw.MULAW, "sampleRate": 8000, "channels": 1},
        **start,
    }
    with pytest.raises(tw.TwilioError):
        tw.decode_inbound(json.dumps({"event": "start", "start": body}))


def test_twilio_stop_that_is_not_an_object_is_refused():
    with pytest.raises(tw.TwilioError):
        tw.decode_inbound('{"event": "stop", "stop": "x"}')


@pytest.mark.parametrize(
    "decode,error",
    [
        (p.decode_client, p.ProtocolError),
        (lambda f: rt.decode_client(f), rt.RealtimeError),
        (tw.decode_inbound, tw.TwilioError),
    ],
)
def test_nesting_deeper_than_the_parser_is_a_typed_error(decode, error):
    with pytest.raises(error):
        decode(deep(100_000))
