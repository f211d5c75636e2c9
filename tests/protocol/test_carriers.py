"""The Telnyx and Plivo media-stream codecs, against the message shapes their published references
give: each message read into the phone door's call events, ours written as the provider reads them,
and malformed messages refused with the provider's error, never a crash."""

from __future__ import annotations

import json

import pytest

from voicert.core import telephony as call
from voicert.protocol import plivo, telnyx
from voicert.protocol import twilio as tw

TELNYX_START = {
    "event": "start",
    "sequence_number": "1",
    "stream_id": "32DE0DEA-53CB-4B21-89A4-9E1819C043BC",
    "start": {
        "user_id": "3E6F995F-85F7-4705-9741-53B116D28237",
        "call_control_id": "v3:T02llQxIyaRkhfRKxgAP8nY511EhFLizdvdUKJiSw8d6A9BborherQ",
        "call_session_id": "ff55a038-6f5d-11ef-9692-02420aeffb1f",
        "from": "+13122010094",
        "to": "+13122123456",
        "client_state": "aGF2ZSBhIG5pY2UgZGF5ID1d",
        "custom_parameters": {"system_prompt": "Be brief."},
        "media_format": {"encoding": "PCMU", "sample_rate": 8000, "channels": 1},
    },
}
PLIVO_START = {
    "event": "start",
    "sequenceNumber": 1,
    "start": {
        "callId": "12345678-1234-1234-1234-123456789abc",
        "streamId": "87654321-4321-4321-4321-cba987654321",
        "accountId": "MAXXXXXXXXXXXXXXXXXX",
        "tracks": ["inbound"],
        "mediaFormat": {"encoding": "audio/x-mulaw", "sampleRate": 8000},
    },
    "extra_headers": "userId=12345;system_prompt=Brief",
}


def test_telnyx_start_media_mark_dtmf_error_and_stop_are_read():
    start = telnyx.decode(json.dumps(TELNYX_START))
    assert start == call.CallStart(
        TELNYX_START["start"]["call_control_id"],
        TELNYX_START["stream_id"],
        "mulaw",
        8000,
        {"system_prompt": "Be brief."},
    )
    media = {"event": "media", "sequence_number": "4", "stream_id": "s"}
    media["media"] = {"track": "inbound", "chunk": "2", "timestamp": "5", "payload": "/38="}
    assert telnyx.decode(json.dumps(media)) == call.CallMedia(b"\xff\x7f", True)
    media["media"]["track"] = "outbound"
    assert telnyx.decode(json.dumps(media)).inbound is False
    mark = {"event": "mark", "sequence_number": "9", "stream_id": "s", "mark": {"name": "a"}}
    assert telnyx.decode(json.dumps(mark)) == call.CallMark("a")
    assert telnyx.decode(json.dumps({"event": "dtmf", "dtmf": {"digit": "7"}})) == call.CallDtmf(
        "7"
    )
    error = {"event": "error", "payload": {"code": 100002, "title": "Unknown error", "detail": "x"}}
    assert telnyx.decode(json.dumps(error)).what.startswith("error 100002: Unknown error")
    assert telnyx.decode(json.dumps({"event": "stop", "stop": {}})) == call.CallStop()
    assert telnyx.decode('{"event": "connected", "version": "1.0.0"}') == call.CallNotice(
        "connected"
    )
    assert telnyx.decode('{"event": "some_future_event"}') is None


def test_telnyx_pcma_is_alaw_and_other_codecs_are_refused_by_name():
    msg = json.loads(json.dumps(TELNYX_START))
    msg["start"]["media_format"]["encoding"] = "PCMA"
    assert telnyx.decode(json.dumps(msg)).encoding == "alaw"
    for codec, rate in (("OPUS", 8000), ("L16", 16000), ("PCMU", 16000)):
        msg["start"]["media_format"] = {"encoding": codec, "sample_rate": rate, "channels": 1}
        refused = telnyx.decode(json.dumps(msg)).refused
        assert refused is not None and codec in refused and "PCMU or PCMA" in refused


def test_plivo_start_media_played_cleared_and_dtmf_are_read():
    start = plivo.decode(json.dumps(PLIVO_START))
    assert start == call.CallStart(
        PLIVO_START["start"]["callId"],
        PLIVO_START["start"]["streamId"],
        "mulaw",
        8000,
        {"userId": "12345", "system_prompt": "Brief"},
    )
    media = {"event": "media", "sequenceNumber": 42, "streamId": "s"}
    media["media"] = {"track": "inbound", "timestamp": "1", "chunk": 41, "payload": "/38="}
    assert plivo.decode(json.dumps(media)) == call.CallMedia(b"\xff\x7f", True)
    played = {"event": "playedStream", "sequenceNumber": 3, "streamId": "s", "name": "turn1-end"}
    assert plivo.decode(json.dumps(played)) == call.CallMark("turn1-end")
    assert plivo.decode('{"event": "clearedAudio", "streamId": "s"}') == call.CallNotice("cleared")
    dtmf = {"event": "dtmf", "streamId": "s", "dtmf": {"track": "inbound", "digit": "5"}}
    assert plivo.decode(json.dumps(dtmf)) == call.CallDtmf("5")


def test_plivo_l16_its_default_is_refused_with_the_setting_to_use():
    msg = json.loads(json.dumps(PLIVO_START))
    msg["start"]["mediaFormat"] = {"encoding": "audio/x-l16", "sampleRate": 8000}
    refused = plivo.decode(json.dumps(msg)).refused
    assert refused is not None and 'contentType="audio/x-mulaw;rate=8000"' in refused


@pytest.mark.parametrize("codec", [telnyx, plivo])
@pytest.mark.parametrize(
    "frame",
    [
        b"\x00binary",
        "{not json",
        "[1, 2]",
        '{"event": 5}',
        '{"event": "start"}',
        '{"event": "start", "start": {"media_format": 1, "mediaFormat": 1}}',
        '{"event": "media", "media": {"payload": "%%%"}}',
        '{"event": "media", "media": {}}',
        '{"event": "dtmf", "dtmf": {"digit": 5}}',
        "[" * 100_000,
    ],
)
def test_malformed_messages_are_the_providers_error(codec, frame):
    with pytest.raises(call.CallMessageError):
        codec.decode(frame)


def test_our_messages_are_what_each_provider_reads():
    ser = telnyx.PROVIDER.serializer(telnyx.decode(json.dumps(TELNYX_START)))
    assert ser.frame_bytes == 160 and ser.silence == b"\xff"
    assert telnyx.decode_outbound(ser.media(b"\x01\x02"))["media"]["payload"] == b"\x01\x02"
    assert telnyx.decode_outbound(ser.mark("m1"))["mark"]["name"] == "m1"
    assert telnyx.decode_outbound(ser.clear()) == {"event": "clear"}
    ser = plivo.PROVIDER.serializer(plivo.decode(json.dumps(PLIVO_START)))
    out = plivo.decode_outbound(ser.media(b"\x01\x02"))
    assert out["event"] == "playAudio" and out["media"]["payload"] == b"\x01\x02"
    assert out["media"]["contentType"] == "audio/x-mulaw" and out["media"]["sampleRate"] == 8000
    checkpoint = plivo.decode_outbound(ser.mark("m1"))
    assert checkpoint == {
        "event": "checkpoint",
        "streamId": PLIVO_START["start"]["streamId"],
        "name": "m1",
    }
    assert plivo.decode_outbound(ser.clear())["event"] == "clearAudio"


def test_each_simulator_side_is_read_back_by_its_codec():
    """The simulators' writers produce what the codecs read: the same events both ways."""
    w = telnyx.InboundWriter("s1", "v3:c1", {"system_prompt": "Hi"})
    assert telnyx.decode(w.start()).parameters == {"system_prompt": "Hi"}
    assert telnyx.decode(w.media(b"\xff" * 160, 20)) == call.CallMedia(b"\xff" * 160, True)
    assert telnyx.decode(w.mark("x")) == call.CallMark("x")
    assert telnyx.decode(w.stop()) == call.CallStop()
    p = plivo.InboundWriter("s2", "c2", {"system_prompt": "Hi"})
    assert plivo.decode(p.start()).parameters == {"system_prompt": "Hi"}
    assert plivo.decode(p.played("x")) == call.CallMark("x")
    t = tw.InboundWriter("MZ1", "CA1")
    assert tw.PROVIDER.decode(t.start()).call_id == "CA1"
    assert tw.PROVIDER.decode(t.start(encoding="audio/l16")).refused is not None
