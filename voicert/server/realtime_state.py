"""The Realtime door's state, sans-I/O: the session core's events in, typed Realtime server events
out (``protocol/realtime_events.py``), with the wire's bookkeeping in between.

One user ``message`` item per committed audio turn or typed message; one response per reply, whose
output is its ``function_call`` items (in the order they were made) and, once it says anything, one
assistant ``message`` item (text, or audio plus its transcript). Wire item ids map to the
session's conversation items, items are kept as last sent (for retrieve, bounded like the
conversation), and assistant audio items keep their timeline (for truncation).

Nothing here sends, awaits or reads a clock: :class:`RealtimeState` returns the events to send, in
order, and the door (``server/realtime.py``) writes them. The one thing it asks of the session,
cutting an assistant item to what was heard, comes in as a function.
"""

from __future__ import annotations

import base64
import dataclasses
import uuid
from collections.abc import Callable

from voicert.agent.conversation import Item
from voicert.core import events as core
from voicert.core.session import ErrorCode
from voicert.protocol import realtime as rt
from voicert.protocol import realtime_events as ev
from voicert.transport.spoken import SpokenReply, bytes_per_ms

MAX_SPOKEN_ITEMS = 64  # assistant audio items whose timeline is kept for truncation
# bytes per millisecond of output audio, by (beta) format name
_BYTES_PER_MS = {name: bytes_per_ms(enc, rate) for name, (enc, rate) in rt.BETA_FORMATS.items()}

# our finish reasons -> the Realtime response status and status_details
_STATUS = {
    "stop": ("completed", None),
    "length": ("incomplete", {"type": "incomplete", "reason": "max_output_tokens"}),
    "cancelled": ("cancelled", {"type": "cancelled", "reason": "client_cancelled"}),
    "interrupted": ("cancelled", {"type": "cancelled", "reason": "turn_detected"}),
    "error": (
        "failed",
        {"type": "failed", "error": {"type": "server_error", "code": "engine_failed"}},
    ),
}

# (conversation item id, the characters heard, the item's offset in the reply) -> the cut item
KeepHeard = Callable[[str, int, int], Item | None]


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:20]}"


def no_item(item_id: str) -> rt.RealtimeError:
    return rt.RealtimeError(
        "invalid_value", f"Item with item_id not found: {item_id[:64]}", "item_id"
    )


@dataclasses.dataclass(slots=True)
class ResponseState:
    response_id: str
    item_id: str  # its message item's wire id (sent once the reply says something)
    audio_out: bool
    message_index: int | None = None  # the message item's output_index, once it is open
    outputs: int = 0  # output items opened so far
    done_items: dict[int, dict] = dataclasses.field(default_factory=dict)  # output_index -> item
    calls: dict[str, tuple[str, int]] = dataclasses.field(default_factory=dict)  # call id ->
    # (wire item id, output_index)
    spoken: SpokenReply | None = None

    def open_output(self) -> int:
        self.outputs += 1
        return self.outputs - 1

    def part_ids(self) -> dict:
        assert self.message_index is not None  # the message item is open
        return {
            "response_id": self.response_id,
            "item_id": self.item_id,
            "output_index": self.message_index,
            "content_index": 0,
        }


class RealtimeState:
    """One Realtime connection's wire state. ``config`` is the session as the client configured
    it (the door replaces it on ``session.update``); ``keep_heard`` cuts a conversation item to
    what the listener heard (the session's ``keep_heard``); ``max_items``: wire items kept."""

    def __init__(
        self,
        config: rt.SessionConfig,
        flavor: rt.Flavor,
        session_id: str,
        keep_heard: KeepHeard,
        max_items: int,
    ) -> None:
        self.config = config
        self.flavor = flavor
        self.session_id = session_id
        self.keep_heard = keep_heard
        self.max_items = max_items
        self.last_item: str | None = None
        self.user_items: dict[int, str] = {}  # turn id -> user item id
        self.responses: dict[int, ResponseState] = {}  # turn id -> the response answering it
        self.partials: dict[int, str] = {}  # turn id -> stable partial text already sent
        self.items: dict[str, str] = {}  # wire item id -> the session's conversation item id
        self.wire_items: dict[str, dict] = {}  # wire item id -> the item as last sent
        self.spoken: dict[str, SpokenReply] = {}  # assistant audio items, by wire id (bounded)

    # ------------------------------------------------------------ items

    def part_type(self, audio: bool) -> str:
        """Content part types as the connection's flavour names them in items."""
        if self.flavor is rt.Flavor.BETA:
            return "audio" if audio else "text"
        return "output_audio" if audio else "output_text"

    def fresh_item_id(self, wanted: str | None) -> str:
        """The id a created item gets: the client's, unless taken (RealtimeError), or a new one."""
        item_id = wanted or new_id("item")
        if item_id in self.wire_items:
            raise rt.RealtimeError(
                "invalid_value", f"Item '{item_id[:64]}' already exists", "item.id"
            )
        return item_id

    def item_added(self, item: dict, core_id: str | None = None) -> list[ev.ServerEvent]:
        """An item joins the conversation (``core_id``: the session's item, when it has one)."""
        if core_id is not None:
            self.items[item["id"]] = core_id
        self._remember(item)
        previous, self.last_item = self.last_item, item["id"]
        out: list[ev.ServerEvent] = [ev.ItemAdded(previous_item_id=previous, item=item)]
        if self.flavor is rt.Flavor.GA and item["status"] == "completed":
            out.append(ev.ItemDone(previous_item_id=previous, item=item))
        return out

    def _remember(self, item: dict) -> None:
        """Keep the item as sent (for retrieve), bounded like the conversation itself."""
        self.wire_items[item["id"]] = item
        while len(self.wire_items) > 2 * self.max_items:
            old = next(iter(self.wire_items))
            self.wire_items.pop(old)
            self.items.pop(old, None)

    def retrievable(self, wire_id: str, exists: Callable[[str], bool]) -> ev.ItemRetrieved:
        """The item as last sent; RealtimeError when it was never made, was deleted or has
        dropped off the old end of the conversation (``exists``: the session still holds it)."""
        item = self.wire_items.get(wire_id)
        core_id = self.items.get(wire_id)
        if item is None or (core_id is not None and not exists(core_id)):
            raise no_item(wire_id)
        return ev.ItemRetrieved(item=item)

    def deletable(self, wire_id: str) -> str:
        """The session's item behind ``wire_id``; RealtimeError when it has none (yet)."""
        core_id = self.items.get(wire_id)
        if core_id is not None:
            return core_id
        if wire_id in self.wire_items:
            raise rt.RealtimeError(
                "invalid_value",
                f"Item '{wire_id[:64]}' is still in progress; it can be deleted once it is done",
                "item_id",
            )
        raise no_item(wire_id)

    def deleted(self, wire_id: str) -> ev.ItemDeleted:
        self.items.pop(wire_id, None)
        self.wire_items.pop(wire_id, None)
        self.spoken.pop(wire_id, None)
        return ev.ItemDeleted(item_id=wire_id)

    def committed(self, turn_id: int) -> list[ev.ServerEvent]:
        """The input buffer of ``turn_id`` is committed: its user audio item."""
        item_id = self.user_item(turn_id)
        out: list[ev.ServerEvent] = [
            ev.AudioCommitted(previous_item_id=self.last_item, item_id=item_id)
        ]
        content = [{"type": "input_audio", "transcript": None}]
        return out + self.item_added(rt.message_item(item_id, "user", "completed", content))

    def user_item(self, turn_id: int) -> str:
        if turn_id not in self.user_items:
            self.user_items[turn_id] = new_id("item")
        return self.user_items[turn_id]

    # ------------------------------------------------------------ truncation

    def truncate(self, event: rt.ItemTruncate) -> ev.ItemTruncated:
        """Cut an assistant audio item to what the listener heard (its transcript too, so the
        next reply does not build on unheard words); RealtimeError for an item that cannot be."""
        spoken = self.spoken.get(event.item_id)
        if spoken is None:
            if event.item_id in self.wire_items:
                raise rt.RealtimeError(
                    "invalid_value",
                    "Only assistant messages with audio can be truncated.",
                    "item_id",
                )
            raise no_item(event.item_id)
        if event.content_index != 0:
            raise rt.RealtimeError(
                "invalid_value",
                "content_index must be 0 (the item's one audio part)",
                "content_index",
            )
        if event.audio_end_ms > spoken.sent_ms + 1:
            raise rt.RealtimeError(
                "invalid_value",
                f"Audio content of {spoken.sent_ms:.0f}ms is "
                f"already shorter than {event.audio_end_ms}ms",
                "audio_end_ms",
            )
        if spoken.item_id:
            self._apply_truncation(event.item_id, spoken, event.audio_end_ms)
        else:  # still being generated: applied when it is done
            spoken.cut_ms = event.audio_end_ms
        return ev.ItemTruncated(
            item_id=event.item_id, content_index=0, audio_end_ms=event.audio_end_ms
        )

    def _apply_truncation(self, wire_id: str, spoken: SpokenReply, audio_end_ms: float) -> None:
        cut = self.keep_heard(spoken.item_id, spoken.heard_chars(audio_end_ms), spoken.item_offset)
        if cut is None:  # dropped off the old end meanwhile
            return
        part = {"type": self.part_type(True), "transcript": cut.text}
        item = self.wire_items.get(wire_id)
        if item is not None:
            self.wire_items[wire_id] = {**item, "content": [part]}

    # ------------------------------------------------------------ session events -> Realtime

    def on_event(self, e: core.SessionEvent) -> list[ev.ServerEvent]:
        """The session's event, as the Realtime server events to send (in order)."""
        if isinstance(e, core.SpeechStarted):
            item_id = self.user_item(e.turn_id)
            return [ev.SpeechStarted(audio_start_ms=e.audio_ms, item_id=item_id)]
        if isinstance(e, core.SpeechStopped):
            out: list[ev.ServerEvent] = [
                ev.SpeechStopped(audio_end_ms=e.audio_ms, item_id=self.user_item(e.turn_id))
            ]
            if self.config.turn_detection is not None:  # server VAD commits by itself
                out += self.committed(e.turn_id)
            return out
        if isinstance(e, core.TranscriptPartial):
            return self._transcript_delta(e)
        if isinstance(e, core.TranscriptFinal):
            return self._transcribed(e)
        if isinstance(e, core.ReplyStarted):
            return [self._response_started(e.turn_id, e.spoken)]
        if isinstance(e, (core.ReplyToken, core.ReplyAudio)):
            r = self.responses.get(e.turn_id)
            return self._output(r, e) if r is not None else []
        if isinstance(e, (core.ToolCallStarted, core.ToolCallArguments, core.ToolCallDone)):
            r = self.responses.get(e.turn_id)
            return self._call_event(r, e) if r is not None else []
        if isinstance(e, core.ToolResult):
            return self.item_added(rt.output_item(new_id("item"), e.call_id, e.output), e.item_id)
        if isinstance(e, core.ReplyDone):
            return self._response_done(e)
        if isinstance(e, core.SessionError):
            bad_input = e.code == ErrorCode.BAD_AUDIO.value
            kind = rt.INVALID_REQUEST if bad_input else rt.SERVER_ERROR
            return [rt.error_event(rt.RealtimeError(e.code, e.message, kind=kind))]
        return []

    def _transcribed(self, e: core.TranscriptFinal) -> list[ev.ServerEvent]:
        """A user audio item now has its transcript (and a conversation item, if it had speech)."""
        wire_id = self.user_items.get(e.turn_id)
        if wire_id is not None and e.item_id:
            self.items[wire_id] = e.item_id
            item = self.wire_items.get(wire_id)
            if item is not None:
                content = [{"type": "input_audio", "transcript": e.text}]
                self.wire_items[wire_id] = {**item, "content": content}
        if not self.config.transcription:
            return []
        usage = {"type": "duration", "seconds": 0}
        item_id = self.user_item(e.turn_id)
        return [
            ev.TranscriptionCompleted(
                item_id=item_id, content_index=0, transcript=e.text, usage=usage
            )
        ]

    def _transcript_delta(self, e: core.TranscriptPartial) -> list[ev.ServerEvent]:
        sent = self.partials.get(e.turn_id, "")
        if not self.config.transcription or not e.stable.startswith(sent) or e.stable == sent:
            return []
        self.partials[e.turn_id] = e.stable
        item_id = self.user_item(e.turn_id)
        return [
            ev.TranscriptionDelta(item_id=item_id, content_index=0, delta=e.stable[len(sent) :])
        ]

    def _response_started(self, turn_id: int, audio_out: bool) -> ev.ResponseCreated:
        r = ResponseState(new_id("resp"), new_id("item"), audio_out)
        self.responses[turn_id] = r
        return ev.ResponseCreated(response=self._response(r, "in_progress", []))

    def _output(self, r: ResponseState, e: core.ReplyToken | core.ReplyAudio) -> list:
        """A reply's text or audio: the message item opened with the first, then its deltas."""
        if isinstance(e, core.ReplyToken) and not e.text:
            return []
        out = self._open_message(r)
        ids = r.part_ids()
        if isinstance(e, core.ReplyToken):
            delta = ev.AudioTranscriptDelta if r.audio_out else ev.TextDelta
            return [*out, delta(**ids, delta=e.text)]
        if r.spoken is not None:
            r.spoken.add(e.audio, e.text)
        audio = base64.b64encode(e.audio).decode("ascii")
        return [*out, ev.AudioDelta(**ids, delta=audio)]

    def _open_message(self, r: ResponseState) -> list[ev.ServerEvent]:
        """The response's message item, opened with its first text or audio."""
        if r.message_index is not None:
            return []
        r.message_index = r.open_output()
        if r.audio_out:
            r.spoken = self.spoken[r.item_id] = SpokenReply(
                _BYTES_PER_MS[self.config.output_format]
            )
            while len(self.spoken) > MAX_SPOKEN_ITEMS:
                self.spoken.pop(next(iter(self.spoken)))
        item = rt.message_item(r.item_id, "assistant", "in_progress", [])
        out: list[ev.ServerEvent] = [
            ev.OutputItemAdded(response_id=r.response_id, output_index=r.message_index, item=item)
        ]
        out += self.item_added(item)
        # content_part events name parts "audio" / "text" in both flavours; items' content does
        # not (GA: output_audio / output_text; see part_type)
        part = {"type": "audio", "transcript": ""} if r.audio_out else {"type": "text", "text": ""}
        out.append(ev.ContentPartAdded(**r.part_ids(), part=part))
        return out

    def _call_event(self, r: ResponseState, e) -> list[ev.ServerEvent]:
        """A function_call output item: added with its name, its arguments streamed, done."""
        if isinstance(e, core.ToolCallStarted):
            wire_id, index = new_id("item"), r.open_output()
            r.calls[e.call_id] = (wire_id, index)
            item = rt.call_item(wire_id, e.call_id, e.name, "", "in_progress")
            added = ev.OutputItemAdded(response_id=r.response_id, output_index=index, item=item)
            return [added, *self.item_added(item, e.item_id)]
        wire_id, index = r.calls[e.call_id]
        ids = {
            "response_id": r.response_id,
            "item_id": wire_id,
            "output_index": index,
            "call_id": e.call_id,
        }
        if isinstance(e, core.ToolCallArguments):
            return [ev.ArgumentsDelta(**ids, delta=e.delta)]
        item = rt.call_item(wire_id, e.call_id, e.name, e.arguments, "completed")
        r.done_items[index] = item
        self._remember(item)
        out: list[ev.ServerEvent] = [
            ev.ArgumentsDone(**ids, name=e.name, arguments=e.arguments),
            ev.OutputItemDone(response_id=r.response_id, output_index=index, item=item),
        ]
        if self.flavor is rt.Flavor.GA:
            out.append(ev.ItemDone(previous_item_id=None, item=item))
        return out

    def _response_done(self, e: core.ReplyDone) -> list[ev.ServerEvent]:
        r = self.responses.pop(e.turn_id, None)
        if r is None:
            return []
        status, details = _STATUS.get(e.finish_reason, _STATUS["error"])
        out = self._message_done(r, e, status) if r.message_index is not None else []
        output = [r.done_items[i] for i in sorted(r.done_items)]
        usage = {
            "total_tokens": e.prompt_tokens + e.tokens,
            "input_tokens": e.prompt_tokens,
            "output_tokens": e.tokens,
        }
        return [*out, ev.ResponseDone(response=self._response(r, status, output, details, usage))]

    def _message_done(
        self, r: ResponseState, e: core.ReplyDone, status: str
    ) -> list[ev.ServerEvent]:
        ids = r.part_ids()
        out: list[ev.ServerEvent]
        if r.audio_out:
            out = [ev.AudioDone(**ids), ev.AudioTranscriptDone(**ids, transcript=e.text)]
            part = {"type": "audio", "transcript": e.text}
        else:
            out = [ev.TextDone(**ids, text=e.text)]
            part = {"type": "text", "text": e.text}
        out.append(ev.ContentPartDone(**ids, part=part))
        part = {**part, "type": self.part_type(r.audio_out)}  # as the item's content
        item_status = "completed" if status == "completed" else "incomplete"
        item = rt.message_item(r.item_id, "assistant", item_status, [part])
        self._remember(item)
        if e.item_id:
            self.items[r.item_id] = e.item_id
        if r.spoken is not None:
            r.spoken.text, r.spoken.item_id = e.text, e.item_id
            r.spoken.item_offset = e.item_offset
            if r.spoken.cut_ms is not None and e.item_id:
                self._apply_truncation(r.item_id, r.spoken, r.spoken.cut_ms)
        assert r.message_index is not None  # called once the message item is open
        r.done_items[r.message_index] = item
        index = r.message_index
        out.append(ev.OutputItemDone(response_id=r.response_id, output_index=index, item=item))
        if self.flavor is rt.Flavor.GA:
            out.append(ev.ItemDone(previous_item_id=None, item=item))
        return out

    def _response(
        self, r: ResponseState, status: str, output: list, details=None, usage=None
    ) -> dict:
        out = {
            "id": r.response_id,
            "object": "realtime.response",
            "status": status,
            "status_details": details,
            "output": output,
            "usage": usage,
            "conversation_id": self.session_id,
        }
        if self.flavor is rt.Flavor.BETA:
            out["modalities"] = ["text", "audio"] if r.audio_out else ["text"]
        else:
            out["output_modalities"] = ["audio"] if r.audio_out else ["text"]
        return out
