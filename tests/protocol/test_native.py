import base64
import json

import msgpack
import pytest

from voicert.protocol import native as p


@pytest.mark.parametrize("binary", [True, False])
def test_client_events_round_trip_in_both_frame_kinds(binary):
    events = [p.SessionStart(sample_rate=24000, encoding="f32", system_prompt="hi",
                             turn_detection="manual", max_new_tokens=12),
              p.Audio(b"\x00\x01\x02\x03"), p.AudioCommit(), p.ResponseCancel(), p.SessionEnd()]
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


@pytest.mark.parametrize("frame, code", [
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
    (msgpack.packb({"type": "session.start", "protocol_version": 2}),
     p.ErrorCode.UNSUPPORTED_VERSION),
    (msgpack.packb({"type": "session.start", "options": {"turn_detection": "x"}}),
     p.ErrorCode.INVALID),
    (msgpack.packb({"type": "session.start", "options": {"max_new_tokens": 0}}),
     p.ErrorCode.INVALID),
])
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
        assert msg == {"type": "turn.latency", "turn_id": 3, "stages": {"ttft_ms": 12.5},
                       "early_asr": False, "early_prefill": False}
    assert list(msgpack.unpackb(p.encode(p.Error("bad_audio", "m")))) [0] == "type"
