"""``/v1/realtime``: the OpenAI Realtime API subset (protocol/realtime.py) onto the session core.

Client events drive the :class:`Session`; the session's native events are translated into Realtime
server events here: one user ``message`` item per committed audio turn or typed message, one
response per reply, whose output is its ``function_call`` items (in the order they were made) and,
once it says anything, one assistant ``message`` item (text, or audio plus its transcript). A call
of a session tool waits for the client's ``function_call_output`` item and ``response.create``; a
call of a server-side tool (``tools.functions``) is answered by the server, whose
``function_call_output`` item joins the conversation, and the response goes on.
"""

from __future__ import annotations

import base64
import dataclasses
import logging
import uuid

from websockets.asyncio.server import ServerConnection

from voicert.agent.session import Services, Session
from voicert.config import TurnConfig
from voicert.core import events as core
from voicert.core.chat import ToolCall
from voicert.core.session import OutputAudio, SessionSettings
from voicert.protocol import native as p
from voicert.protocol import realtime as rt
from voicert.server import offloop
from voicert.server.connection import CLOSE_TRY_AGAIN, BaseConnection, check_output_audio
from voicert.speech.tts import unoffered
from voicert.transport.spoken import SpokenReply, bytes_per_ms

log = logging.getLogger(__name__)
REALTIME_PATH = "/v1/realtime"

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


def _no_item(item_id: str) -> rt.RealtimeError:
    return rt.RealtimeError(
        "invalid_value", f"Item with item_id not found: {item_id[:64]}", "item_id"
    )


def flavor_of(headers) -> rt.Flavor:
    """Beta event names for clients that ask for the beta API (``OpenAI-Beta: realtime=v1``)."""
    beta = headers.get("OpenAI-Beta", "") if headers is not None else ""
    return rt.Flavor.BETA if "realtime=v1" in beta else rt.Flavor.GA


MAX_SPOKEN_ITEMS = 64  # assistant audio items whose timeline is kept for truncation
# bytes per millisecond of output audio, by (beta) format name
_BYTES_PER_MS = {name: bytes_per_ms(enc, rate) for name, (enc, rate) in rt.BETA_FORMATS.items()}


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


class RealtimeConnection(BaseConnection):
    client_errors = (rt.RealtimeError, p.ProtocolError)

    def __init__(self, ws: ServerConnection, services: Services) -> None:
        super().__init__(ws, services)
        request = ws.request
        self.writer = rt.EventWriter(flavor_of(request.headers if request else None))
        query = request.path.partition("?")[2] if request else ""
        params = dict(kv.partition("=")[::2] for kv in query.split("&") if kv)
        self.model = params.get("model", "voicert")
        self.session_id = f"sess_{uuid.uuid4().hex[:20]}"
        tts = services.tts
        self.config = rt.SessionConfig(
            instructions=services.cfg.llm.system_prompt,
            audio_out=tts is not None,
            voice=tts.default_voice if tts is not None else "",
        )
        self.last_item: str | None = None
        self.user_items: dict[int, str] = {}  # turn id -> user item id
        self.responses: dict[int, ResponseState] = {}  # turn id -> the response answering it
        self.partials: dict[int, str] = {}  # turn id -> stable partial text already sent
        self.items: dict[str, str] = {}  # wire item id -> the session's conversation item id
        self.wire_items: dict[str, dict] = {}  # wire item id -> the item as last sent
        self.spoken: dict[str, SpokenReply] = {}  # assistant audio items, by wire id (bounded)

    # ------------------------------------------------------------ session core

    def _session_start(self) -> tuple[SessionSettings, bool]:
        c = self.config
        enc, rate = rt.BETA_FORMATS[c.input_format]
        out_enc, out_rate = rt.BETA_FORMATS[c.output_format]
        manual = c.turn_detection is None
        start = SessionSettings(
            sample_rate=rate,
            encoding=enc,
            system_prompt=c.instructions,
            turn_detection="manual" if manual else "server_vad",
            max_new_tokens=c.max_output_tokens,
            output_audio=OutputAudio(out_enc, out_rate) if c.audio_out else None,
            tools=c.tools,
            tool_choice=c.tool_choice,
            voice=c.voice if self.svc.tts is not None else None,
            temperature=c.temperature,
        )
        auto_respond = c.turn_detection is not None and c.turn_detection.create_response
        return start, auto_respond

    def _turn_config(self) -> TurnConfig:
        """``semantic_vad``: the semantic detector, its maximum silence by eagerness (without the
        audio model loaded on this server, the transcript's words judge alone)."""
        td, turn = self.config.turn_detection, self.svc.cfg.turn
        # Realtime clients stop playing at speech_started: speech over a reply interrupts at once
        turn = dataclasses.replace(turn, backchannels=False)
        if td is None or td.type != "semantic_vad":
            return dataclasses.replace(turn, detector="silence")
        longest = {
            "low": min(2 * turn.max_silence_ms, 10000),
            "high": max(turn.pause_ms + 320, 800),
        }
        return dataclasses.replace(
            turn,
            detector="semantic",
            max_silence_ms=longest.get(td.eagerness, turn.max_silence_ms),
            model=turn.model if self.svc.turn_judge is not None else "none",
            text_cue=turn.text_cue or self.svc.turn_judge is None,
        )

    def _vad_config(self):
        td, vad = self.config.turn_detection, self.svc.cfg.vad
        if td is None:
            return vad
        return dataclasses.replace(
            vad,
            threshold=td.threshold,
            neg_threshold=min(vad.neg_threshold, td.threshold),
            min_silence_ms=td.silence_duration_ms,
            speech_pad_ms=td.prefix_padding_ms,
            barge_in=td.interrupt_response,
        )

    async def open(self) -> bool:
        """The session starts with the socket; False (and the socket closing) when the server has
        no room for it."""
        try:
            self.claim_session()
        except p.ProtocolError as exc:
            await self.fatal(exc.code, exc.message)
            await self.ws.close(CLOSE_TRY_AGAIN, "session limit reached")
            return False
        start, auto = self._session_start()
        self.session = Session(
            self.session_id,
            start,
            self.svc,
            self.on_event,
            auto_respond=auto,
            vad=self._vad_config(),
            turn=self._turn_config(),
        )
        await self.send_event("session.created", session=self._wire_session())
        return True

    def _wire_session(self) -> dict:
        return self.config.to_wire(self.writer.flavor, self.session_id, self.model)

    async def send_event(self, ga_name: str, **fields) -> None:
        await self.send_frame(self.writer.event(ga_name, **fields))

    async def reject(self, exc: Exception) -> None:
        if isinstance(exc, p.ProtocolError):  # from the session core (bad audio bytes...)
            exc = rt.RealtimeError(exc.code.value, exc.message)
        assert isinstance(exc, rt.RealtimeError)  # this door's client errors
        self.svc.metrics.observe_error(exc.code)
        await self.send_frame(self.writer.error(exc))

    async def fatal(self, code: p.ErrorCode, message: str) -> None:
        await self.send_frame(
            self.writer.error(rt.RealtimeError(code.value, message, kind=rt.SERVER_ERROR))
        )

    # ------------------------------------------------------------ client events

    async def dispatch(self, frame: bytes | str) -> bool:
        event, event_id = await offloop.decode(rt.decode_client, frame)
        try:
            await self._handle(event)
        except rt.RealtimeError as exc:
            exc.event_id = exc.event_id or event_id
            raise
        return False

    async def _handle(self, event: rt.ClientEvent) -> None:
        s = self.started
        if isinstance(event, rt.AudioAppend):
            await s.on_audio(event.audio)
        elif isinstance(event, rt.SessionUpdate):
            await self._update(event.session)
        elif isinstance(event, rt.AudioCommit):
            turn_id = s.next_turn_id
            if not s.commit():
                raise rt.RealtimeError(
                    "input_audio_buffer_commit_empty",
                    "Error committing input audio buffer: buffer is empty.",
                )
            await self._committed(turn_id)
        elif isinstance(event, rt.AudioClear):
            s.clear_audio()
            await self.send_event("input_audio_buffer.cleared")
        elif isinstance(event, rt.ItemCreate):
            await self._item_create(event)
        elif isinstance(event, rt.ResponseCreate):
            if self.svc.draining:
                raise rt.RealtimeError(
                    p.ErrorCode.SHUTTING_DOWN.value, "server is shutting down", kind=rt.SERVER_ERROR
                )
            if (
                event.tool_choice is not None
                and event.tool_choice.name
                and event.tool_choice.name not in {t.name for t in s.offered_tools(event.tools)}
            ):
                raise rt.RealtimeError(
                    "invalid_value",
                    f"response.tool_choice names "
                    f"{event.tool_choice.name[:64]!r}, which is not a tool",
                    "response.tool_choice",
                )
            try:
                s.respond(
                    event.max_output_tokens,
                    event.instructions,
                    event.audio_out,
                    event.tool_choice,
                    event.tools,
                )
            except p.ProtocolError as exc:
                if exc.code is not p.ErrorCode.INVALID:
                    raise
                raise rt.RealtimeError("invalid_value", exc.message, "response.tools") from None
        elif isinstance(event, rt.ResponseCancel):
            if s.idle():
                raise rt.RealtimeError(
                    "response_cancel_not_active", "Cancellation failed: no active response found."
                )
            s.cancel_response()
        elif isinstance(event, rt.ItemTruncate):
            await self._truncate(event)
        elif isinstance(event, rt.ItemDelete):
            await self._delete(event.item_id)
        elif isinstance(event, rt.ItemRetrieve):
            item = self.wire_items.get(event.item_id)
            core_id = self.items.get(event.item_id)
            if item is None or (core_id is not None and self.started.item(core_id) is None):
                raise _no_item(event.item_id)  # never made, deleted, or dropped off the old end
            await self.send_event("conversation.item.retrieved", item=item)

    async def _update(self, changes: dict) -> None:
        config = rt.update_session(self.config, changes)
        tts = self.svc.tts
        if config.audio_out and tts is None:
            raise rt.RealtimeError(
                p.ErrorCode.NO_SPEECH_OUTPUT.value,
                "this server has no speech output; use text modalities",
                "session.modalities",
            )
        refusal = (
            unoffered(tts.voices if tts is not None else None, config.voice)
            if config.voice != self.config.voice
            else None
        )
        if refusal is not None:
            raise rt.RealtimeError("invalid_value", refusal, "session.voice")
        old, self.config = self.config, config
        try:
            start, auto = self._session_start()
            check_output_audio(start.output_audio, self.svc)
            self.started.set_tools(config.tools, config.tool_choice)
            self.started.reconfigure(start, auto, self._vad_config(), self._turn_config())
        except p.ProtocolError as exc:  # refused: the session keeps its settings
            self.config = old
            self.started.set_tools(old.tools, old.tool_choice)
            raise rt.RealtimeError("invalid_value", exc.message, "session.tools") from None
        except Exception:
            self.config = old
            self.started.set_tools(old.tools, old.tool_choice)
            raise
        await self.send_event("session.updated", session=self._wire_session())

    async def _truncate(self, event: rt.ItemTruncate) -> None:
        """Cut an assistant audio item to what the listener heard (its transcript too, so the next
        reply does not build on unheard words)."""
        spoken = self.spoken.get(event.item_id)
        if spoken is None:
            if event.item_id in self.wire_items:
                raise rt.RealtimeError(
                    "invalid_value",
                    "Only assistant messages with audio can be truncated.",
                    "item_id",
                )
            raise _no_item(event.item_id)
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
        await self.send_event(
            "conversation.item.truncated",
            item_id=event.item_id,
            content_index=0,
            audio_end_ms=event.audio_end_ms,
        )

    def _apply_truncation(self, wire_id: str, spoken: SpokenReply, audio_end_ms: float) -> None:
        cut = self.started.keep_heard(
            spoken.item_id, spoken.heard_chars(audio_end_ms), spoken.item_offset
        )
        if cut is None:  # dropped off the old end meanwhile
            return
        part = {"type": self._part_type(True), "transcript": cut.text}
        item = self.wire_items.get(wire_id)
        if item is not None:
            self.wire_items[wire_id] = {**item, "content": [part]}

    def _remember(self, item: dict) -> None:
        """Keep the item as sent (for retrieve), bounded like the conversation itself."""
        self.wire_items[item["id"]] = item
        while len(self.wire_items) > 2 * self.svc.cfg.server.max_history_items:
            old = next(iter(self.wire_items))
            self.wire_items.pop(old)
            self.items.pop(old, None)

    async def _delete(self, wire_id: str) -> None:
        core_id = self.items.get(wire_id)
        if core_id is None:
            if wire_id in self.wire_items:
                raise rt.RealtimeError(
                    "invalid_value",
                    f"Item '{wire_id[:64]}' is still in "
                    "progress; it can be deleted once it is done",
                    "item_id",
                )
            raise _no_item(wire_id)
        try:
            self.started.delete_item(core_id)
        except KeyError:
            raise _no_item(wire_id) from None
        self.items.pop(wire_id, None)
        self.wire_items.pop(wire_id, None)
        self.spoken.pop(wire_id, None)
        await self.send_event("conversation.item.deleted", item_id=wire_id)

    def _part_type(self, audio: bool) -> str:
        """Content part types as the connection's flavour names them."""
        if self.writer.flavor is rt.Flavor.BETA:
            return "audio" if audio else "text"
        return "output_audio" if audio else "output_text"

    async def _item_create(self, event: rt.ItemCreate) -> None:
        if event.kind != "message":
            await self._call_item_create(event)
            return
        if not event.text.strip():
            raise rt.RealtimeError("invalid_value", "item.content text is empty", "item.content")
        item_id = event.item_id or f"item_{uuid.uuid4().hex[:20]}"
        if item_id in self.wire_items:
            raise rt.RealtimeError(
                "invalid_value", f"Item '{item_id[:64]}' already exists", "item.id"
            )
        self.items[item_id] = self.started.add_item(event.role, event.text).item_id
        kind = "input_text" if event.role != "assistant" else self._part_type(False)
        item = rt.message_item(
            item_id, event.role, "completed", [{"type": kind, "text": event.text}]
        )
        await self._item_added(item)

    async def _call_item_create(self, event: rt.ItemCreate) -> None:
        """A function_call_output (a client tool's result) or a function_call the client
        records."""
        item_id = event.item_id or f"item_{uuid.uuid4().hex[:20]}"
        if item_id in self.wire_items:
            raise rt.RealtimeError(
                "invalid_value", f"Item '{item_id[:64]}' already exists", "item.id"
            )
        if event.kind == "function_call_output":
            try:
                core_item = self.started.add_tool_output(event.call_id, event.text)
            except KeyError:
                raise rt.RealtimeError(
                    "invalid_value",
                    f"No function call with call_id '{event.call_id[:64]}' in the conversation",
                    "item.call_id",
                ) from None
            item = rt.output_item(item_id, event.call_id, event.text)
        else:
            core_item = self.started.add_call(ToolCall(event.call_id, event.name, event.text))
            item = rt.call_item(item_id, event.call_id, event.name, event.text, "completed")
        self.items[item_id] = core_item.item_id
        await self._item_added(item)

    async def _item_added(self, item: dict) -> None:
        self._remember(item)
        previous, self.last_item = self.last_item, item["id"]
        await self.send_event("conversation.item.added", previous_item_id=previous, item=item)
        if self.writer.flavor is rt.Flavor.GA and item["status"] == "completed":
            await self.send_event("conversation.item.done", previous_item_id=previous, item=item)

    async def _committed(self, turn_id: int) -> None:
        item_id = self._user_item(turn_id)
        await self.send_event(
            "input_audio_buffer.committed", previous_item_id=self.last_item, item_id=item_id
        )
        await self._item_added(
            rt.message_item(
                item_id, "user", "completed", [{"type": "input_audio", "transcript": None}]
            )
        )

    def _user_item(self, turn_id: int) -> str:
        if turn_id not in self.user_items:
            self.user_items[turn_id] = f"item_{uuid.uuid4().hex[:20]}"
        return self.user_items[turn_id]

    # ------------------------------------------------------------ session events -> Realtime

    async def on_event(self, ev: core.SessionEvent) -> None:
        """The session's events, as Realtime server events."""
        if isinstance(ev, core.SpeechStarted):
            await self.send_event(
                "input_audio_buffer.speech_started",
                audio_start_ms=ev.audio_ms,
                item_id=self._user_item(ev.turn_id),
            )
        elif isinstance(ev, core.SpeechStopped):
            await self.send_event(
                "input_audio_buffer.speech_stopped",
                audio_end_ms=ev.audio_ms,
                item_id=self._user_item(ev.turn_id),
            )
            if self.config.turn_detection is not None:  # server VAD commits by itself
                await self._committed(ev.turn_id)
        elif isinstance(ev, core.TranscriptPartial):
            await self._transcript_delta(ev)
        elif isinstance(ev, core.TranscriptFinal):
            self._transcribed(ev)
            if self.config.transcription:
                await self.send_event(
                    "conversation.item.input_audio_transcription.completed",
                    item_id=self._user_item(ev.turn_id),
                    content_index=0,
                    transcript=ev.text,
                    usage={"type": "duration", "seconds": 0},
                )
        elif isinstance(ev, core.ReplyStarted):
            await self._response_started(ev.turn_id, ev.spoken)
        elif isinstance(ev, core.ReplyToken):
            r = self.responses.get(ev.turn_id)
            if r is not None and ev.text:
                await self._open_message(r)
                name = (
                    "response.output_audio_transcript.delta"
                    if r.audio_out
                    else "response.output_text.delta"
                )
                await self.send_event(
                    name,
                    response_id=r.response_id,
                    item_id=r.item_id,
                    output_index=r.message_index,
                    content_index=0,
                    delta=ev.text,
                )
        elif isinstance(ev, core.ReplyAudio):
            r = self.responses.get(ev.turn_id)
            if r is not None:
                await self._open_message(r)
                if r.spoken is not None:
                    r.spoken.add(ev.audio, ev.text)
                await self.send_event(
                    "response.output_audio.delta",
                    response_id=r.response_id,
                    item_id=r.item_id,
                    output_index=r.message_index,
                    content_index=0,
                    delta=base64.b64encode(ev.audio).decode("ascii"),
                )
        elif isinstance(ev, (core.ToolCallStarted, core.ToolCallArguments, core.ToolCallDone)):
            r = self.responses.get(ev.turn_id)
            if r is not None:
                await self._call_event(r, ev)
        elif isinstance(ev, core.ToolResult):
            wire_id = f"item_{uuid.uuid4().hex[:20]}"
            self.items[wire_id] = ev.item_id
            await self._item_added(rt.output_item(wire_id, ev.call_id, ev.output))
        elif isinstance(ev, core.ReplyDone):
            await self._response_done(ev)
        elif isinstance(ev, core.SessionError):
            self.svc.metrics.observe_error(ev.code)
            kind = (
                rt.INVALID_REQUEST if ev.code in (p.ErrorCode.BAD_AUDIO.value,) else rt.SERVER_ERROR
            )
            await self.send_frame(
                self.writer.error(rt.RealtimeError(ev.code, ev.message, kind=kind))
            )

    def _transcribed(self, ev: core.TranscriptFinal) -> None:
        """A user audio item now has its transcript (and a conversation item, if it had speech)."""
        wire_id = self.user_items.get(ev.turn_id)
        if wire_id is None or not ev.item_id:
            return
        self.items[wire_id] = ev.item_id
        item = self.wire_items.get(wire_id)
        if item is not None:
            self.wire_items[wire_id] = {
                **item,
                "content": [{"type": "input_audio", "transcript": ev.text}],
            }

    async def _transcript_delta(self, ev: core.TranscriptPartial) -> None:
        sent = self.partials.get(ev.turn_id, "")
        if not self.config.transcription or not ev.stable.startswith(sent) or ev.stable == sent:
            return
        self.partials[ev.turn_id] = ev.stable
        await self.send_event(
            "conversation.item.input_audio_transcription.delta",
            item_id=self._user_item(ev.turn_id),
            content_index=0,
            delta=ev.stable[len(sent) :],
        )

    async def _response_started(self, turn_id: int, audio_out: bool) -> None:
        r = ResponseState(
            f"resp_{uuid.uuid4().hex[:20]}", f"item_{uuid.uuid4().hex[:20]}", audio_out
        )
        self.responses[turn_id] = r
        await self.send_event("response.created", response=self._response(r, "in_progress", []))

    async def _open_message(self, r: ResponseState) -> None:
        """The response's message item, opened with its first text or audio."""
        if r.message_index is not None:
            return
        r.message_index = r.open_output()
        if r.audio_out:
            r.spoken = self.spoken[r.item_id] = SpokenReply(
                _BYTES_PER_MS[self.config.output_format]
            )
            while len(self.spoken) > MAX_SPOKEN_ITEMS:
                self.spoken.pop(next(iter(self.spoken)))
        item = rt.message_item(r.item_id, "assistant", "in_progress", [])
        await self.send_event(
            "response.output_item.added",
            response_id=r.response_id,
            output_index=r.message_index,
            item=item,
        )
        await self._item_added(item)
        # content_part events name parts "audio" / "text" in both flavours; items' content does
        # not (GA: output_audio / output_text; see _part_type)
        part = {"type": "audio", "transcript": ""} if r.audio_out else {"type": "text", "text": ""}
        await self.send_event(
            "response.content_part.added",
            response_id=r.response_id,
            item_id=r.item_id,
            output_index=r.message_index,
            content_index=0,
            part=part,
        )

    async def _call_event(self, r: ResponseState, ev) -> None:
        """A function_call output item: added with its name, its arguments streamed, done."""
        if isinstance(ev, core.ToolCallStarted):
            wire_id, index = f"item_{uuid.uuid4().hex[:20]}", r.open_output()
            r.calls[ev.call_id] = (wire_id, index)
            self.items[wire_id] = ev.item_id
            item = rt.call_item(wire_id, ev.call_id, ev.name, "", "in_progress")
            await self.send_event(
                "response.output_item.added",
                response_id=r.response_id,
                output_index=index,
                item=item,
            )
            await self._item_added(item)
            return
        wire_id, index = r.calls[ev.call_id]
        ids = {
            "response_id": r.response_id,
            "item_id": wire_id,
            "output_index": index,
            "call_id": ev.call_id,
        }
        if isinstance(ev, core.ToolCallArguments):
            await self.send_event("response.function_call_arguments.delta", **ids, delta=ev.delta)
            return
        await self.send_event(
            "response.function_call_arguments.done", **ids, name=ev.name, arguments=ev.arguments
        )
        item = rt.call_item(wire_id, ev.call_id, ev.name, ev.arguments, "completed")
        r.done_items[index] = item
        self._remember(item)
        await self.send_event(
            "response.output_item.done", response_id=r.response_id, output_index=index, item=item
        )
        if self.writer.flavor is rt.Flavor.GA:
            await self.send_event("conversation.item.done", previous_item_id=None, item=item)

    async def _response_done(self, ev: core.ReplyDone) -> None:
        r = self.responses.pop(ev.turn_id, None)
        if r is None:
            return
        status, details = _STATUS.get(ev.finish_reason, _STATUS["error"])
        if r.message_index is not None:
            await self._message_done(r, ev, status)
        output = [r.done_items[i] for i in sorted(r.done_items)]
        usage = {
            "total_tokens": ev.prompt_tokens + ev.tokens,
            "input_tokens": ev.prompt_tokens,
            "output_tokens": ev.tokens,
        }
        await self.send_event(
            "response.done", response=self._response(r, status, output, details, usage)
        )

    async def _message_done(self, r: ResponseState, ev: core.ReplyDone, status: str) -> None:
        ids = {
            "response_id": r.response_id,
            "item_id": r.item_id,
            "output_index": r.message_index,
            "content_index": 0,
        }
        if r.audio_out:
            await self.send_event("response.output_audio.done", **ids)
            await self.send_event(
                "response.output_audio_transcript.done", **ids, transcript=ev.text
            )
            part = {"type": "audio", "transcript": ev.text}
        else:
            await self.send_event("response.output_text.done", **ids, text=ev.text)
            part = {"type": "text", "text": ev.text}
        await self.send_event("response.content_part.done", **ids, part=part)
        part = {**part, "type": self._part_type(r.audio_out)}  # as the item's content
        item_status = "completed" if status == "completed" else "incomplete"
        item = rt.message_item(r.item_id, "assistant", item_status, [part])
        self._remember(item)
        if ev.item_id:
            self.items[r.item_id] = ev.item_id
        if r.spoken is not None:
            r.spoken.text, r.spoken.item_id = ev.text, ev.item_id
            r.spoken.item_offset = ev.item_offset
            if r.spoken.cut_ms is not None and ev.item_id:
                self._apply_truncation(r.item_id, r.spoken, r.spoken.cut_ms)
        assert r.message_index is not None  # called once the message item is open
        r.done_items[r.message_index] = item
        await self.send_event(
            "response.output_item.done",
            response_id=r.response_id,
            output_index=r.message_index,
            item=item,
        )
        if self.writer.flavor is rt.Flavor.GA:
            await self.send_event("conversation.item.done", previous_item_id=None, item=item)

    def _response(
        self, r: ResponseState, status: str, output: list, details=None, usage=None
    ) -> dict:
        modalities = ["audio"] if r.audio_out else ["text"]
        out = {
            "id": r.response_id,
            "object": "realtime.response",
            "status": status,
            "status_details": details,
            "output": output,
            "usage": usage,
            "conversation_id": self.session_id,
        }
        if self.writer.flavor is rt.Flavor.BETA:
            out["modalities"] = ["text", "audio"] if r.audio_out else ["text"]
        else:
            out["output_modalities"] = modalities
        return out
