"""The Realtime door's sans-I/O state on its own: the session's events in, typed server events out,
in the API's order; no socket, no session, no loop."""

from __future__ import annotations

import dataclasses
import json

from voicert.core import events as core
from voicert.protocol import realtime as rt
from voicert.protocol import realtime_events as ev
from voicert.server.realtime_state import RealtimeState


def state(flavor: rt.Flavor = rt.Flavor.GA, cut: list | None = None) -> RealtimeState:
    def keep_heard(item_id: str, chars: int, offset: int):
        (cut if cut is not None else []).append((item_id, chars, offset))
        return None

    return RealtimeState(
        rt.SessionConfig("Be brief.", audio_out=False), flavor, "sess_1", keep_heard, 100
    )


def test_a_text_reply_becomes_one_response_with_its_message_item_in_order():
    s = state()
    out = s.on_event(core.ReplyStarted(1, spoken=False))
    out += s.on_event(core.ReplyToken(1, 0, "Paris"))
    out += s.on_event(core.ReplyToken(1, 1, ""))  # a token that adds no text: nothing
    out += s.on_event(core.ReplyToken(1, 2, "."))
    out += s.on_event(core.ReplyDone(1, "Paris.", 2, 30, "stop", item_id="it-1"))
    assert [type(e) for e in out] == [
        ev.ResponseCreated,
        ev.OutputItemAdded,
        ev.ItemAdded,
        ev.ContentPartAdded,
        ev.TextDelta,
        ev.TextDelta,
        ev.TextDone,
        ev.ContentPartDone,
        ev.OutputItemDone,
        ev.ItemDone,
        ev.ResponseDone,
    ]
    created, done = out[0], out[-1]
    assert isinstance(created, ev.ResponseCreated) and isinstance(done, ev.ResponseDone)
    assert created.response["id"] == done.response["id"]
    assert done.response["status"] == "completed"
    assert done.response["usage"] == {"total_tokens": 32, "input_tokens": 30, "output_tokens": 2}
    (item,) = done.response["output"]
    assert item["content"] == [{"type": "output_text", "text": "Paris."}]
    assert s.items[item["id"]] == "it-1"  # the wire item maps to the conversation's


def test_events_of_a_turn_with_no_response_send_nothing():
    s = state()
    assert s.on_event(core.ReplyToken(7, 0, "x")) == []
    assert s.on_event(core.ReplyDone(7, "x", 1, 1, "stop")) == []


def test_server_vad_commits_the_user_item_when_speech_stops():
    s = state()  # server VAD: the default turn detection
    started = s.on_event(core.SpeechStarted(1, 100))
    stopped = s.on_event(core.SpeechStopped(1, 900))
    assert [type(e) for e in started + stopped] == [
        ev.SpeechStarted,
        ev.SpeechStopped,
        ev.AudioCommitted,
        ev.ItemAdded,
        ev.ItemDone,
    ]
    user_item = started[0].item_id
    assert all(e.item_id == user_item for e in (started[0], stopped[0], stopped[1]))


def test_the_writer_names_events_in_the_connections_flavour_with_fresh_ids():
    ga, beta = rt.EventWriter(rt.Flavor.GA), rt.EventWriter(rt.Flavor.BETA)
    event = ev.ItemAdded(previous_item_id=None, item={"id": "item_1"})
    first, second = json.loads(ga.encode(event)), json.loads(ga.encode(event))
    assert first["type"] == "conversation.item.added" and first["event_id"] != second["event_id"]
    assert json.loads(beta.encode(event))["type"] == "conversation.item.created"
    assert first == {
        "type": "conversation.item.added",
        "event_id": first["event_id"],
        "previous_item_id": None,
        "item": {"id": "item_1"},
    }


def test_a_truncation_waits_for_the_reply_to_be_done_then_cuts_its_item():
    cut: list = []
    s = state(cut=cut)
    s.config = dataclasses.replace(s.config, audio_out=True)
    s.on_event(core.ReplyStarted(1, spoken=True))
    opened = s.on_event(core.ReplyAudio(1, 0, b"\0" * 4800, "Paris is the capital."))
    wire_id = opened[0].item["id"]
    truncated = s.truncate(rt.ItemTruncate(wire_id, 0, 50))
    assert isinstance(truncated, ev.ItemTruncated) and cut == []  # not done yet: pending
    s.on_event(core.ReplyDone(1, "Paris is the capital.", 5, 20, "interrupted", item_id="it-9"))
    assert [c[0] for c in cut] == ["it-9"]  # applied to the conversation item once it exists
