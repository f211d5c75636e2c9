"""Client JSON must be text: a lone surrogate ("\\ud800", legal JSON) is refused where it enters,
at every door, with that door's typed error; a surrogate pair (an emoji) is text and passes."""

import json

import pytest

from voicert.protocol import chat, jsontext
from voicert.protocol import native as p
from voicert.protocol import realtime as rt
from voicert.protocol import twilio as tw

LONE = "\\ud800"  # as JSON escapes it
PAIR = "\\ud83d\\ude00"  # 😀


@pytest.mark.parametrize("where", ["a value", "a key", "deep"])
def test_a_lone_surrogate_anywhere_is_not_text(where):
    doc = {
        "a value": f'{{"x": "a{LONE}b"}}',
        "a key": f'{{"k{LONE}": 1}}',
        "deep": f'{{"x": [[[{{"y": ["{LONE}"]}}]]]}}',
    }[where]
    with pytest.raises(jsontext.NotText):
        jsontext.loads(doc)
    with pytest.raises(jsontext.NotText):
        jsontext.loads(doc.encode())


def test_surrogate_pairs_and_plain_text_are_text():
    assert jsontext.loads(f'{{"x": "{PAIR}"}}') == {"x": "😀"}
    assert jsontext.loads('{"x": "\\\\ud800 is how you write one"}')["x"].startswith("\\ud800")


def test_the_native_door_refuses_it_as_an_invalid_message():
    with pytest.raises(p.ProtocolError) as info:
        p.decode_client(f'{{"type": "user.text", "text": "hi {LONE}"}}')
    assert info.value.code is p.ErrorCode.INVALID and "surrogate" in info.value.message
    start = f'{{"type": "session.start", "system_prompt": "{LONE}"}}'
    with pytest.raises(p.ProtocolError):
        p.decode_client(start)


def test_the_realtime_door_refuses_it_with_an_error_event():
    item = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "x"}]}
    frame = json.dumps({"type": "conversation.item.create", "item": item}).replace(
        '"x"', f'"{LONE}"'
    )
    with pytest.raises(rt.RealtimeError) as info:
        rt.decode_client(frame)
    assert info.value.code == "invalid_value"


def test_chat_completions_refuse_it_with_a_400():
    body = f'{{"model": "m", "messages": [{{"role": "user", "content": "{LONE}"}}]}}'
    with pytest.raises(chat.ChatError) as info:
        chat.parse_request(body.encode(), 10_000)
    assert info.value.status == 400


def test_a_twilio_message_with_one_is_malformed():
    start = f'{{"event": "start", "start": {{"customParameters": {{"system_prompt": "{LONE}"}}}}}}'
    with pytest.raises(tw.TwilioError):
        tw.decode_inbound(start)


@pytest.mark.parametrize(
    "text, why",
    [
        ('{"n": 1e400}', "the number 1e400 is beyond a finite float"),
        ('{"n": -1e400}', "the number -1e400 is beyond a finite float"),
        ('{"n": NaN}', "NaN is not a JSON number"),
        ('{"n": Infinity}', "Infinity is not a JSON number"),
        ('{"n": 99999999999999999999999}', "is beyond a 64-bit integer"),
        ("[" * 65 + "]" * 65, "nested deeper than 64 levels"),
        ('{"a":' * 300 + "1" + "}" * 300, "nested deeper than 64 levels"),
    ],
)
def test_numbers_and_nesting_no_part_takes_are_refused_where_they_enter(text, why):
    with pytest.raises(jsontext.BadValue) as bad:
        jsontext.loads(text)
    assert why in str(bad.value)
    assert jsontext.loads("[" * 64 + "]" * 64) is not None  # as deep as it may go


def test_each_door_answers_them_with_its_own_typed_error():
    import msgpack

    from voicert.protocol import native

    deep = {"type": "session.start"}
    for _ in range(900):  # under msgpack's own limit
        deep = {"x": deep}
    with pytest.raises(native.ProtocolError) as bad:
        native.decode_client(msgpack.packb({"type": "tool.result", "output": deep}))
    assert "nested deeper" in str(bad.value)
    with pytest.raises(rt.RealtimeError) as info:
        rt.decode_client('{"type": "response.create", "response": {"temperature": 1e400}}')
    assert info.value.code == "invalid_value"
    start = '{"event": "start", "sequenceNumber": 1e400, "start": {"streamSid": "S"}}'
    with pytest.raises(tw.TwilioError) as err:
        tw.decode_inbound(start)
    assert "1e400" in str(err.value)
