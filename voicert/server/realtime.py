"""``/v1/realtime``: the OpenAI Realtime API subset (protocol/realtime.py) onto the session core.

A thin I/O shell: client events drive the :class:`Session`; the session's events go through the
connection's sans-I/O :class:`~voicert.server.realtime_state.RealtimeState`, which returns typed
server events (``protocol/realtime_events.py``) that are written here. A call of a session tool
waits for the client's ``function_call_output`` item and ``response.create``; a call of a
server-side tool (``tools.functions``) is answered by the server, whose ``function_call_output``
item joins the conversation, and the response goes on.
"""

from __future__ import annotations

import dataclasses
import logging

from websockets.asyncio.server import ServerConnection

from voicert.agent.session import Services, Session
from voicert.config import TurnConfig
from voicert.core import events as core
from voicert.core.chat import ToolCall
from voicert.core.session import OutputAudio, SessionSettings
from voicert.protocol import native as p
from voicert.protocol import realtime as rt
from voicert.protocol import realtime_events as ev
from voicert.server import offloop
from voicert.server.connection import CLOSE_TRY_AGAIN, BaseConnection, check_output_audio
from voicert.server.realtime_state import RealtimeState, new_id, no_item
from voicert.speech.tts import unoffered

log = logging.getLogger(__name__)
REALTIME_PATH = "/v1/realtime"


def flavor_of(headers) -> rt.Flavor:
    """Beta event names for clients that ask for the beta API (``OpenAI-Beta: realtime=v1``)."""
    beta = headers.get("OpenAI-Beta", "") if headers is not None else ""
    return rt.Flavor.BETA if "realtime=v1" in beta else rt.Flavor.GA


class RealtimeConnection(BaseConnection):
    client_errors = (rt.RealtimeError, p.ProtocolError)

    def __init__(self, ws: ServerConnection, services: Services) -> None:
        super().__init__(ws, services)
        request = ws.request
        self.writer = rt.EventWriter(flavor_of(request.headers if request else None))
        query = request.path.partition("?")[2] if request else ""
        params = dict(kv.partition("=")[::2] for kv in query.split("&") if kv)
        self.model = params.get("model", "voicert")
        tts = services.tts
        config = rt.SessionConfig(
            instructions=services.cfg.llm.system_prompt,
            audio_out=tts is not None,
            voice=tts.default_voice if tts is not None else "",
        )
        self.state = RealtimeState(
            config,
            self.writer.flavor,
            new_id("sess"),
            lambda item_id, chars, offset: self.started.keep_heard(item_id, chars, offset),
            services.cfg.server.max_history_items,
        )

    @property
    def config(self) -> rt.SessionConfig:
        return self.state.config

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
            self.state.session_id,
            start,
            self.svc,
            self.on_event,
            auto_respond=auto,
            vad=self._vad_config(),
            turn=self._turn_config(),
        )
        await self.send(ev.SessionCreated(session=self._wire_session()))
        return True

    def _wire_session(self) -> dict:
        return self.config.to_wire(self.writer.flavor, self.state.session_id, self.model)

    async def send(self, *events: ev.ServerEvent) -> None:
        for event in events:
            await self.send_frame(self.writer.encode(event))

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
            await self.send(*self.state.committed(turn_id))
        elif isinstance(event, rt.AudioClear):
            s.clear_audio()
            await self.send(ev.AudioCleared())
        elif isinstance(event, rt.ItemCreate):
            await self._item_create(event)
        elif isinstance(event, rt.ResponseCreate):
            if self.svc.draining:
                raise rt.RealtimeError(
                    p.ErrorCode.SHUTTING_DOWN.value, "server is shutting down", kind=rt.SERVER_ERROR
                )
            if not s.idle():  # as OpenAI answers: never a reply dropped in silence
                raise rt.RealtimeError(
                    "conversation_already_has_active_response",
                    "Conversation already has an active response in progress. Wait until the "
                    "response is finished before creating a new one.",
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
            await self.send(self.state.truncate(event))
        elif isinstance(event, rt.ItemDelete):
            await self._delete(event.item_id)
        elif isinstance(event, rt.ItemRetrieve):
            exists = lambda core_id: self.started.item(core_id) is not None
            await self.send(self.state.retrievable(event.item_id, exists))

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
        old, self.state.config = self.config, config
        try:
            start, auto = self._session_start()
            check_output_audio(start.output_audio, self.svc)
            self.started.set_tools(config.tools, config.tool_choice)
            self.started.reconfigure(start, auto, self._vad_config(), self._turn_config())
        except p.ProtocolError as exc:  # refused: the session keeps its settings
            self.state.config = old
            self.started.set_tools(old.tools, old.tool_choice)
            raise rt.RealtimeError("invalid_value", exc.message, "session.tools") from None
        except Exception:
            self.state.config = old
            self.started.set_tools(old.tools, old.tool_choice)
            raise
        await self.send(ev.SessionUpdated(session=self._wire_session()))

    async def _delete(self, wire_id: str) -> None:
        core_id = self.state.deletable(wire_id)
        try:
            self.started.delete_item(core_id)
        except KeyError:
            raise no_item(wire_id) from None
        await self.send(self.state.deleted(wire_id))

    async def _item_create(self, event: rt.ItemCreate) -> None:
        if event.kind != "message":
            await self._call_item_create(event)
            return
        if not event.text.strip():
            raise rt.RealtimeError("invalid_value", "item.content text is empty", "item.content")
        item_id = self.state.fresh_item_id(event.item_id)
        core_id = self.started.add_item(event.role, event.text).item_id
        kind = "input_text" if event.role != "assistant" else self.state.part_type(False)
        content = [{"type": kind, "text": event.text}]
        item = rt.message_item(item_id, event.role, "completed", content)
        await self.send(*self.state.item_added(item, core_id))

    async def _call_item_create(self, event: rt.ItemCreate) -> None:
        """A function_call_output (a client tool's result) or a function_call the client
        records."""
        item_id = self.state.fresh_item_id(event.item_id)
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
        await self.send(*self.state.item_added(item, core_item.item_id))

    # ------------------------------------------------------------ session events -> Realtime

    async def on_event(self, event: core.SessionEvent) -> None:
        """The session's events, as Realtime server events (the state decides which)."""
        if isinstance(event, core.SessionError):
            self.svc.metrics.observe_error(event.code)
        await self.send(*self.state.on_event(event))
