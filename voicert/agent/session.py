"""One conversation: audio in, VAD and endpointing, turns (ASR -> LLM -> tokens out), history.

The session is driven by its connection: the connection decodes client events and calls the methods
here; the session sends server events through ``emit``. Each turn runs in one task so that reading
(cancel, barge-in, disconnect) goes on while a reply streams.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from concurrent.futures import Executor
from dataclasses import dataclass, field

from voicert.agent.conversation import Conversation, Item, Role, TextTooLong
from voicert.agent.reply import Reply, ReplyOutcome
from voicert.agent.speech_out import AudioOut, SpeechOut
from voicert.agent.toolbox import Toolbox
from voicert.agent.turns import (
    DecodeKind,
    Detection,
    DropDecode,
    JudgeTurn,
    ScoreText,
    StartDecode,
    TurnEnded,
    TurnJudged,
    TurnTaking,
)
from voicert.audio.clock import AudioClock
from voicert.audio.pcm import AudioFormatError, StreamResampler, decode_pcm
from voicert.audio.playout import Playout
from voicert.config import Config, TurnConfig, VadConfig
from voicert.core import events as ev
from voicert.core.bucket import TokenBucket
from voicert.core.chat import ChatMessage, ToolCall, ToolChoice, ToolChoiceMode, ToolSpec
from voicert.core.llm import GREEDY, Engine, FinishReason, GenerationRequest, Sampling, TokenEvent
from voicert.core.session import ErrorCode, SessionRefused, SessionSettings
from voicert.core.speech import EARLY, FINAL, PARTIAL, Asr, AsrHandle, SpeechUnavailable, TurnAudio
from voicert.speech.denoise import RnNoise
from voicert.speech.echo import EchoGuard
from voicert.speech.smart_turn import Judge
from voicert.speech.tts import TtsWorker, unoffered
from voicert.speech.turn_text import is_backchannel
from voicert.speech.vad import SileroVad, VadBatcher, VadStream
from voicert.telemetry.gcwatch import GcWatch
from voicert.telemetry.latency import Point, TurnRecord, TurnTrace, now_ns
from voicert.telemetry.metrics import Metrics
from voicert.telemetry.tracing import TurnSpans

log = logging.getLogger(__name__)
Emit = Callable[[ev.SessionEvent], Awaitable[None]]
_request_ids = itertools.count(1)
_Scoring = tuple[str, AsyncIterator[TokenEvent]]  # a score_end request's id and its stream


@dataclass(slots=True)
class Services:
    """What all sessions share: config and the loaded models."""

    cfg: Config
    vad: SileroVad
    asr: Asr
    engine: Engine
    metrics: Metrics = field(default_factory=Metrics)
    tts: TtsWorker | None = None  # speech out; None when tts.engine is none
    vad_pool: Executor | None = None  # vad.threads > 0: VAD batches are scored here, off the loop
    vad_batcher: VadBatcher | None = None  # every session's windows of a tick in one model call
    draining: bool = False  # set at shutdown: no new turns start
    gc_watch: GcWatch | None = None  # times this process's garbage collections (for /metrics)
    turn_judge: Judge | None = None  # turn.detector semantic with an audio model: it scores pauses
    denoise: RnNoise | None = None  # asr.denoise rnnoise: each session's input goes through it
    toolbox: Toolbox | None = None  # tools.functions: the tools the server runs itself
    spans: TurnSpans | None = None  # telemetry.otel_endpoint: each turn as OpenTelemetry spans


async def _drain(stream) -> None:
    async for _ in stream:
        pass


@dataclass(slots=True)
class Ahead:
    """A request sent on the early transcript, before the turn was decided: the reply itself
    (``turn.preempt``: its tokens wait in ``stream`` until the turn ends on that transcript), or
    only its prompt's prefill (``stream`` None: one token, drained and thrown away)."""

    request: GenerationRequest
    stream: AsyncIterator[TokenEvent] | None = None

    def fits(self, request: GenerationRequest) -> bool:
        """The reply would ask exactly this (the conversation, tools and limits have not moved
        since), so its stream can be taken as that reply's."""
        a = self.request
        return self.stream is not None and (
            a.messages,
            a.tools,
            a.tool_choice,
            a.max_new_tokens,
            a.parallel_tool_calls,
            a.sampling.temperature,
        ) == (
            request.messages,
            request.tools,
            request.tool_choice,
            request.max_new_tokens,
            request.parallel_tool_calls,
            request.sampling.temperature,
        )


@dataclass(slots=True)
class Turn:
    turn_id: int
    trace: TurnTrace
    task: asyncio.Task | None = None
    reply: Reply | None = None  # once the reply's request is in the engine
    early_asr: bool = False  # the transcript came from the decode started before the endpoint
    early_prefill: bool = (
        False  # its reply was started (or its prompt prefilled) before the endpoint
    )
    ahead: Ahead | None = (
        None  # the reply started on the early transcript, until taken or withdrawn
    )
    cancel_requested: bool = False
    cancel_reason: str = "cancelled"
    system_prompt: str | None = None  # this reply's own instructions (else the session's)
    speak: bool | None = None  # speak this reply (None: if the session has output audio)
    tool_choice: ToolChoice | None = None  # this reply's own (else the session's)
    tools: tuple[ToolSpec, ...] | None = None  # this reply's client tools (else the session's)
    audio_seq: int = 0  # the next ReplyAudio chunk's number (one count over all its rounds)


def _calls_stand(reason: str) -> bool:
    """Whether a round's complete calls are made: after a stop, and after the token budget ran
    out (a call cut off there is reported as broken; those before it were whole). Not after an
    error or a cancel."""
    return reason in (FinishReason.STOP.value, FinishReason.LENGTH.value)


@dataclass(slots=True)
class ReplyTally:
    """A reply over several rounds (model, tools, model...), as its one ReplyDone reports it."""

    texts: list[str] = field(default_factory=list)
    tokens: int = 0
    prompt_tokens: int = 0
    item_id: str = ""  # the last assistant message item
    item_offset: int = 0  # where that item's text starts in ``text``
    waiting: tuple[str, ...] = ()  # calls left for the client to answer

    def add(self, out: ReplyOutcome, item: Item | None) -> None:
        if out.text:
            self.texts.append(out.text)
        self.tokens += out.tokens
        self.prompt_tokens = out.prompt_tokens or self.prompt_tokens
        if item is not None:
            self.item_id = item.item_id
            self.item_offset = len(self.text) - len(out.text)

    @property
    def text(self) -> str:
        return " ".join(self.texts)


class _Ids:
    """Call and item ids for a reply's tool calls (see agent/reply.py CallIds)."""

    def __init__(self, history: Conversation) -> None:
        self.history = history

    def call_id(self) -> str:
        return f"call_{uuid.uuid4().hex[:24]}"

    def item_id(self) -> str:
        return self.history.new_id()


class Session:
    """``auto_respond``: reply to each transcribed turn (the native protocol); when False a turn
    only adds the transcript to the conversation and :meth:`respond` asks for a reply (the
    Realtime API without turn detection)."""

    def __init__(
        self,
        session_id: str,
        settings: SessionSettings,
        services: Services,
        emit: Emit,
        auto_respond: bool = True,
        vad: VadConfig | None = None,
        turn: TurnConfig | None = None,
    ) -> None:
        self.id = session_id
        self.auto_respond = auto_respond
        self.vad_cfg = vad or services.cfg.vad
        self.settings = settings
        self.svc = services
        self.cfg = services.cfg
        self.emit = emit
        srv = services.cfg.server
        self.history = Conversation(srv.max_history_items, srv.max_text_chars)
        self._check_text(settings.system_prompt, "system_prompt")
        self.system_prompt = settings.system_prompt or self.cfg.llm.system_prompt
        self.max_new_tokens = settings.max_new_tokens or self.cfg.llm.max_new_tokens
        self.resampler = StreamResampler(settings.sample_rate)
        self.denoiser = services.denoise.stream() if services.denoise is not None else None
        self.vad = VadStream(services.vad)
        self.echo = self._echo_guard(turn or self.cfg.turn, settings)
        self.turns = TurnTaking(
            self.vad_cfg,
            Detection(settings.turn_detection),
            self.cfg.asr.early_final_ms,
            self.cfg.asr.partial_interval_ms,
            auto_respond,
            turn or self.cfg.turn,
            score_text=self.svc.engine.scores,
        )
        self.turn: Turn | None = None
        self.playout = Playout()  # when the reply audio sent plays at the caller's end
        self.decodes: dict[int, AsrHandle] = {}  # early, partial, overlap decodes in flight, by id
        self.ahead: dict[int, Ahead] = {}  # early decode id -> its reply (or prefill) started ahead
        self.judging: set[asyncio.Task] = set()  # judgements and overlap screens in flight
        self._detached: set[asyncio.Task] = set()  # sends and drains not waited for
        self.activity_ns = now_ns()  # the caller's last speech or text, or a reply's end
        server = services.cfg.server
        self.audio_budget = TokenBucket(server.max_audio_rate, server.audio_burst_s)
        self.clock = AudioClock()  # how late the caller's audio is handled (its ingest lag)
        self.audio_dropped_s = 0.0  # audio refused so far (over the budget)
        self._flood_said_ns = 0  # when the last audio_too_fast error was raised
        self.tools: tuple[ToolSpec, ...] = ()  # tools the client declared (it runs them)
        self.tool_choice = ToolChoice(ToolChoiceMode(self.cfg.tools.choice))
        self.set_tools(settings.tools, settings.tool_choice)
        self.voice: str | None = None  # a voice id of the server's (None: its default)
        self.set_voice(settings.voice)

    # ------------------------------------------------------------ audio and endpointing

    @property
    def next_turn_id(self) -> int:
        """The id the utterance in progress (or the next reply) will get."""
        return self.turns.next_turn_id

    def caller_idle(self) -> None:
        """The door's reader waited for the caller before its next message (nothing of the
        caller's was waiting to be read): the audio that comes next is handled as it comes."""
        self.clock.idle()

    async def on_audio(self, data: bytes) -> None:
        """Raises ProtocolError(BAD_AUDIO) for bytes that are not whole samples or not finite."""
        received_ns = now_ns()
        try:
            x = decode_pcm(data, self.settings.encoding)
        except AudioFormatError as exc:
            raise SessionRefused(ErrorCode.BAD_AUDIO, str(exc)) from None
        seconds = x.size / self.settings.sample_rate
        lag_ns = self.clock.frame(x.size * 1_000_000_000 // self.settings.sample_rate, received_ns)
        self.svc.metrics.note_ingest_lag(lag_ns)
        if not self.audio_budget.take(seconds, received_ns / 1e9):
            self.audio_dropped_s += seconds
            self._audio_dropped(received_ns)
            return
        x16 = self.resampler(x)
        if self.denoiser is not None:
            x16 = self.denoiser(x16)  # ~0.1 of a core in real time: on the loop, per 20 ms frame
        self.turns.push(x16)
        if self.svc.vad_batcher is not None:
            # scored with every other session's windows of this loop tick (one model call per
            # window position); frames of one session stay in order: its connection awaits each
            probs = await self.vad.push_batched(x16, self.svc.vad_batcher)
        else:
            probs = self.vad.push(x16)
        if self.echo is not None:
            probs = self.echo.screen(x16, probs, received_ns)  # its own voice back: silence
        if probs.size:
            await self._act_all(
                self.turns.on_windows(
                    probs, received_ns, now_ns(), self._asr_busy, self._agent_speaking(), lag_ns
                )
            )

    @staticmethod
    def _echo_guard(turn: TurnConfig, settings: SessionSettings) -> EchoGuard | None:
        """A screen for the session's own reply audio in its input (``turn.echo_guard``), when
        the session's replies are spoken."""
        if not turn.echo_guard or settings.output_audio is None:
            return None
        return EchoGuard(turn.echo_threshold)

    def _replying(self) -> bool:
        """A reply is in the engine and not yet over (speech now may be a backchannel)."""
        turn = self.turn
        return (
            turn is not None
            and turn.task is not None
            and not turn.task.done()
            and turn.reply is not None
        )

    def _agent_speaking(self) -> bool:
        """The agent has the floor: a reply is being generated or sent, or its audio, all sent
        already (a fast engine and voice), is still playing at the caller's end, as a client
        that plays what arrives in real time would. Speech now may be a backchannel."""
        return self._replying() or self.playout.playing(now_ns())

    def _asr_busy(self) -> bool:
        return self.svc.asr.pending() > 0

    def commit(self) -> bool:
        """Push-to-talk end of turn: everything since the last turn (or since speech started).
        False when there was no audio to transcribe (no turn starts)."""
        actions = self.turns.commit(now_ns())
        for action in actions:
            self._act_now(action)
        return any(isinstance(a, TurnEnded) for a in actions)

    def clear_audio(self) -> None:
        """Forget the input audio not yet turned into a turn (and any decode begun on it)."""
        for action in self.turns.clear():
            self._act_now(action)

    async def _act(self, action) -> None:
        """Carry out one turn-taking decision (agent/turns.py)."""
        if isinstance(action, ev.BargeIn):
            if self.vad_cfg.barge_in:  # the door stops the audio still playing, too
                self._barge_in()
                await self.emit(action)
        elif isinstance(action, (ev.SpeechStarted, ev.SpeechStopped, ev.TranscriptPartial)):
            if isinstance(action, ev.SpeechStarted):
                self.touch()
            await self.emit(action)  # core events: the door maps them onto its wire
        else:
            self._act_now(action)

    def _act_now(self, action) -> None:
        """The decisions that need no sending: decodes and the end of a turn."""
        if isinstance(action, StartDecode):
            kind, done = {
                DecodeKind.EARLY: (EARLY, self._on_early),
                DecodeKind.PARTIAL: (PARTIAL, self._on_partial),
                DecodeKind.OVERLAP: (FINAL, self._on_overlap),  # a barge-in may wait
            }[action.kind]
            if kind == EARLY and self.turns.judges_text:
                kind = FINAL  # the semantic verdict waits for it: the endpoint is behind it
            handle = self.decodes[action.decode_id] = self.svc.asr.submit(action.audio, kind)
            handle.future.add_done_callback(functools.partial(done, action.decode_id))
        elif isinstance(action, DropDecode):
            dropped = self.decodes.pop(action.decode_id, None)
            if dropped is not None:
                dropped.drop()  # a decode already running finishes and is ignored
            ahead = self.ahead.pop(action.decode_id, None)
            if ahead is not None:
                self._withdraw(ahead)
        elif isinstance(action, TurnEnded):
            self._start_turn(action)
        elif isinstance(action, TurnJudged):
            self.svc.metrics.verdicts.labels(action.verdict.value).inc()
            for opinion in action.late:
                self.svc.metrics.opinions_late.labels(opinion).inc()
        elif isinstance(action, JudgeTurn):
            self._spawn(self._judge(action), f"judge-{self.id}")
        elif isinstance(action, ScoreText):
            first = self._submit_score(action.text)  # now: a reply started next shares its step
            task = self._spawn(self._score_text(action, first), f"score-{self.id}")
            if first is not None:  # cancelled before it ran, it never reads (or cancels) it
                task.add_done_callback(functools.partial(self._withdraw_score, first[0]))
        elif isinstance(action, (ev.TranscriptPartial, ev.SpeechStopped)):
            self._detach(self.emit(action))

    async def _judge(self, action: JudgeTurn) -> None:
        """Score a pause with the turn-completion model (off the loop), then let turn-taking
        decide; a failed model leaves the decision to the words."""
        heard: TurnAudio | None = None
        if self.svc.turn_judge is not None:
            t0 = time.perf_counter_ns()
            try:
                heard = await self.svc.turn_judge.score(action.audio)
            except SpeechUnavailable as exc:  # stopping, or the speech host restarting
                log.warning("session %s: no turn-completion judgement: %s", self.id, exc)
            except Exception:
                log.exception("session %s: the turn-completion model failed", self.id)
            self.svc.metrics.judge_seconds.observe((time.perf_counter_ns() - t0) / 1e9)
        prob, pause = (None, None) if heard is None else (heard.complete, heard.pause)
        await self._act_all(self.turns.judged(action.judge_id, prob, now_ns(), pause))

    async def _score_text(self, action: ScoreText, first: _Scoring | None) -> None:
        """The LLM's end-of-turn scores of the early transcript (``first``: its ``score_end``
        request on this conversation, already submitted; its prefix is cached), then let
        turn-taking decide; a failed score leaves the decision to the other opinions. An engine
        whose model has an end-of-turn head answers with it; one without is asked a second time,
        on the bare transcript."""
        t0 = time.perf_counter_ns()
        text_prob, head_prob = await self._end_prob(first)
        bare_prob = None
        if head_prob is None and text_prob is not None:
            bare_prob, _ = await self._end_prob(self._submit_score(action.bare))
        self.svc.metrics.score_seconds.observe((time.perf_counter_ns() - t0) / 1e9)
        actions = self.turns.text_scored(action.judge_id, text_prob, bare_prob, now_ns(), head_prob)
        await self._act_all(actions)

    def _withdraw_score(self, rid: str, task: asyncio.Task) -> None:
        """A score's reader is done: if it was cancelled (before it ran, it never cancelled its
        request itself), the engine drops the request."""
        if task.cancelled():
            self.svc.engine.cancel(rid)

    def _submit_score(self, text: str) -> _Scoring | None:
        """Ask the engine now for the end-of-turn scores after ``text`` (None: no text)."""
        if not text:
            return None
        rid = f"{self.id}-score-{next(_request_ids)}"
        request = GenerationRequest(rid, self._messages(text), 1, self.id, score_end=True)
        return rid, self.svc.engine.submit(request)

    async def _end_prob(self, scoring: _Scoring | None) -> tuple[float | None, float | None]:
        """(P(the user's message ends after the text ``scoring`` asked about), the end-of-turn
        head's P(over) there); None for each when there is no text, the engine has no head, or
        it failed."""
        if scoring is None:
            return None, None
        rid, stream = scoring
        probs: tuple[float | None, float | None] = None, None
        try:
            async for event in stream:
                if event.finish_reason is not None:
                    probs = event.end_prob, event.turn_prob
                    if event.error:
                        log.warning("session %s: end-of-turn score: %s", self.id, event.error)
        except asyncio.CancelledError:
            self.svc.engine.cancel(rid)
            raise
        return probs

    def _detach(self, coro) -> None:
        """Run ``coro`` to its end without waiting for it; the task is held until then (the loop
        keeps only a weak reference: an unheld task can be collected mid-flight)."""
        task = asyncio.ensure_future(coro)
        self._detached.add(task)
        task.add_done_callback(self._detached.discard)

    def _spawn(self, coro, name: str) -> asyncio.Task:
        """A judgement or an overlap screen: cancelled with the session."""
        task = asyncio.create_task(coro, name=name)
        self.judging.add(task)
        task.add_done_callback(self.judging.discard)
        return task

    def _check_text(self, text: str | None, what: str) -> None:
        """Raises ProtocolError(TEXT_TOO_LONG) for a client text over ``server.max_text_chars``."""
        if text is None:
            return
        try:
            self.history.check_text(text)
        except TextTooLong as exc:
            raise SessionRefused(ErrorCode.TEXT_TOO_LONG, f"{what}: {exc}") from None

    def add_user_text(self, text: str) -> Item:
        """A typed user message joins the conversation (after any reply now streaming).
        Raises ProtocolError(TEXT_TOO_LONG)."""
        item = self.add_item(Role.USER, text)
        self.touch()
        return item

    def _audio_dropped(self, at_ns: int) -> None:
        """A frame over ``server.max_audio_rate`` was dropped: say so, at most once a second
        (SessionRefused AUDIO_TOO_FAST: the door sends a non-fatal error, the session goes on)."""
        if at_ns - self._flood_said_ns < 1_000_000_000:
            return
        self._flood_said_ns = at_ns
        s = self.cfg.server
        self.svc.metrics.observe_error(ErrorCode.AUDIO_TOO_FAST.value)
        raise SessionRefused(
            ErrorCode.AUDIO_TOO_FAST,
            f"audio faster than {s.max_audio_rate:g}x real time (bursts of {s.audio_burst_s:g} s): "
            f"{self.audio_dropped_s:.1f} s dropped so far",
        )

    def touch(self) -> None:
        """The session is in use now (speech, text, a reply running): the voice-idle clock
        (``server.voice_idle_timeout_s``) starts again."""
        self.activity_ns = now_ns()

    def add_item(self, role: Role | str, text: str, item_id: str | None = None) -> Item:
        """Any message joins the conversation. Raises ProtocolError(TEXT_TOO_LONG)."""
        self._check_text(text, f"{Role(role).value} text")
        return self.history.add(role, text, item_id)

    def item(self, item_id: str) -> Item | None:
        """A conversation item by id (None when unknown or dropped off the old end)."""
        return self.history.find(item_id)

    def keep_heard(self, item_id: str, heard_chars: int, offset: int = 0) -> Item | None:
        """Cut a reply's assistant item to what the listener heard before an interruption, so
        that the next reply does not build on unheard words: ``heard_chars`` of the reply's whole
        text, in which the item's text starts at ``offset`` (ReplyDone's ``item_offset``). None
        when the item is gone (dropped off the old end) or is not an assistant message."""
        try:
            return self.history.truncate(item_id, max(heard_chars - offset, 0))
        except (KeyError, ValueError):
            return None

    def delete_item(self, item_id: str) -> Item:
        """Remove an item from the conversation. Raises KeyError for an unknown one."""
        return self.history.delete(item_id)

    def set_tools(self, tools: tuple[ToolSpec, ...] | None, choice: ToolChoice | None) -> None:
        """The tools the client declares (None: unchanged) and the session's tool_choice (None:
        unchanged). Raises ProtocolError(INVALID) for a tool named like a server-side tool, or a
        named choice that is no tool."""
        tools = self.tools if tools is None else tuple(tools)
        choice = self.tool_choice if choice is None else choice
        self._check_tools(tools, choice)
        self.tools, self.tool_choice = tools, choice

    def _check_tools(self, tools: tuple[ToolSpec, ...], choice: ToolChoice | None) -> None:
        """Raises ProtocolError(INVALID) for a tool named like a server-side tool, or a named
        choice that is none of the tools (the server's or these)."""
        server = self._server_tools
        clash = sorted({t.name for t in tools} & server)
        if clash:
            raise SessionRefused(
                ErrorCode.INVALID, f"tool {clash[0]!r} is a server-side tool; declare another name"
            )
        if (
            choice is not None
            and choice.name
            and choice.name not in server | {t.name for t in tools}
        ):
            raise SessionRefused(
                ErrorCode.INVALID,
                f"tool_choice names {choice.name!r}, which is not among the tools",
            )

    @property
    def _server_tools(self) -> frozenset[str]:
        """Names of the tools the server runs itself."""
        return self.svc.toolbox.names if self.svc.toolbox is not None else frozenset()

    def waiting_calls(self) -> list[Item]:
        """The client's calls that have no output yet."""
        server = self._server_tools
        return [i for i in self.history.pending_calls() if i.name not in server]

    def set_voice(self, voice: str | None) -> None:
        """The voice the session's next replies speak in: one of the server's voice ids (None:
        the server's default). Raises ProtocolError(INVALID) for another, or when the server has
        no speech output."""
        refusal = (
            None
            if voice is None
            else unoffered(self.svc.tts.voices if self.svc.tts is not None else None, voice)
        )
        if refusal is not None:
            raise SessionRefused(ErrorCode.INVALID, refusal)
        self.voice = voice

    def set_system_prompt(self, text: str) -> None:
        """Raises ProtocolError(TEXT_TOO_LONG)."""
        self._check_text(text, "system_prompt")
        self.system_prompt = text or self.cfg.llm.system_prompt

    def offered_tools(self, client: tuple[ToolSpec, ...] | None = None) -> tuple[ToolSpec, ...]:
        """Every tool a reply may call: the server's, then the client's (``client``: a reply's
        own, in place of the session's)."""
        server = self.svc.toolbox.specs if self.svc.toolbox is not None else ()
        return (*server, *(self.tools if client is None else client))

    def add_call(self, call: ToolCall) -> Item:
        """A function call the client records joins the conversation. Raises
        ProtocolError(TEXT_TOO_LONG)."""
        self._check_text(call.arguments, "tool call arguments")
        return self.history.add_call(call)

    def add_tool_output(self, call_id: str, output: str, item_id: str | None = None) -> Item:
        """A call's output (from the client) joins the conversation. Raises
        ProtocolError(TEXT_TOO_LONG), or KeyError when no call has ``call_id``."""
        self._check_text(output, "tool output")
        return self.history.add_output(call_id, output, item_id)

    def reconfigure(
        self,
        settings: SessionSettings,
        auto_respond: bool,
        vad: VadConfig,
        turn: TurnConfig | None = None,
    ) -> None:
        """Change the session's settings mid-conversation (the Realtime API's session.update).
        A new input rate takes effect with the next audio; new VAD settings reset the endpointer."""
        self._check_text(settings.system_prompt, "instructions")
        self.set_voice(settings.voice)
        if settings.sample_rate != self.settings.sample_rate:
            self.resampler = StreamResampler(settings.sample_rate)
        self.vad_cfg = vad
        self.turns.reconfigure(vad, Detection(settings.turn_detection), auto_respond, turn)
        if self.echo is None or settings.output_audio is None:  # spoken replies turned on or off
            self.echo = self._echo_guard(turn or self.cfg.turn, settings)
        self.settings = settings
        self.auto_respond = auto_respond
        self.system_prompt = settings.system_prompt or self.cfg.llm.system_prompt
        self.max_new_tokens = settings.max_new_tokens or self.cfg.llm.max_new_tokens

    def respond(
        self,
        max_new_tokens: int | None = None,
        instructions: str | None = None,
        speak: bool | None = None,
        tool_choice: ToolChoice | None = None,
        tools: tuple[ToolSpec, ...] | None = None,
    ) -> int:
        """Reply to the conversation as it stands (no audio turn); returns the turn id. A reply
        still streaming is interrupted first. ``ttft_ms`` runs from this call.
        ``instructions`` replace the system prompt for this reply only; ``speak`` overrides whether
        it is spoken (default: when the session has output audio); ``tools`` replace the client's
        tools for this reply only (the server's stay). Raises ProtocolError (TEXT_TOO_LONG) for
        instructions over the limit, (INVALID) for tools or a tool_choice that do not fit."""
        self._check_text(instructions, "instructions")
        if tools is not None or tool_choice is not None:
            self._check_tools(self.tools if tools is None else tools, tool_choice)
        trace = TurnTrace(self.turns.new_turn_id())
        trace.mark(Point.ENDPOINT_AUDIO)  # asked for now, by a message: no audio to wait for
        trace.mark(Point.ENDPOINT, trace.points[Point.ENDPOINT_AUDIO])
        previous = self.turn
        if previous is not None and previous.task is not None and not previous.task.done():
            self._cancel(previous, "interrupted")
        turn = Turn(
            trace.turn_id,
            trace,
            system_prompt=instructions,
            speak=speak,
            tool_choice=tool_choice,
            tools=tools,
        )
        turn.task = asyncio.create_task(
            self._run_response(turn, previous, max_new_tokens),
            name=f"response-{self.id}-{turn.turn_id}",
        )
        self.turn = turn
        return turn.turn_id

    def _on_early(self, decode_id: int, fut: asyncio.Future) -> None:
        """The early transcript is in before the endpoint: start the reply on it now
        (``turn.preempt``; else prefill its prompt), so that when the turn ends on this transcript
        its first token is already made. No token of it reaches the client before the endpoint.
        When the engine also scores the transcript (the hazard), the two requests share its next
        prefill step: the reply's first token comes with the scores, so a turn the scores end
        has its first token at once (on the 2-core CPU a prefill costs ~65 ms however much of
        the prompt is cached: one after the other would add that)."""
        failed = fut.cancelled() or fut.exception() is not None
        if self.turns.early_is_current(decode_id):
            # the transcript is also the text cue of a semantic judgement of this pause
            heard = None if failed else fut.result()
            decided = self.turns.early_done(
                decode_id,
                None if heard is None else heard.text,
                now_ns(),
                None if heard is None else heard.ending,
            )
            for action in decided:  # the scores go in before the reply started below
                if isinstance(action, ScoreText):
                    self._act_now(action)
            rest = [a for a in decided if not isinstance(a, ScoreText)]
            if rest:
                self._detach(self._act_all(rest))
        if not self.turns.early_is_current(decode_id) or failed or not fut.result().text:
            return
        self._start_ahead(decode_id, fut.result().text)

    def _start_ahead(self, decode_id: int, text: str) -> None:
        """Send the reply to ``text`` (or, without ``turn.preempt``, prefill its prompt). Not
        when no reply follows a turn by itself (the client asks for each: the Realtime API's
        ``create_response: false``): it would only be withdrawn."""
        if not self.auto_respond:
            return
        if self.cfg.turn.preempt:
            request = self._request(None, None, 0, user_text=text)
            self.ahead[decode_id] = Ahead(request, self.svc.engine.submit(request))
            return
        messages = self._messages(text)
        request = GenerationRequest(f"{self.id}-warm-{next(_request_ids)}", messages, 1, self.id)
        self.ahead[decode_id] = Ahead(request)
        self._detach(_drain(self.svc.engine.submit(request)))

    def _withdraw(self, ahead: Ahead) -> None:
        """A reply (or prefill) started ahead is not wanted: the engine frees it."""
        self.svc.engine.cancel(ahead.request.request_id)
        if ahead.stream is not None:
            self._detach(_drain(ahead.stream))  # its last event, the cancel, ends it

    async def _act_all(self, actions: list) -> None:
        for action in actions:
            await self._act(action)

    def _on_partial(self, decode_id: int, fut: asyncio.Future) -> None:
        self.decodes.pop(decode_id, None)
        ok = not fut.cancelled() and fut.exception() is None
        for action in self.turns.partial_done(decode_id, fut.result().text if ok else None):
            self._act_now(action)

    def _on_overlap(self, decode_id: int, fut: asyncio.Future) -> None:
        """Speech over the reply that reached turn.interrupt_ms is transcribed: a backchannel
        lets the reply go on, anything else interrupts it."""
        self.decodes.pop(decode_id, None)
        ok = not fut.cancelled() and fut.exception() is None
        actions = self.turns.overlap_done(decode_id, fut.result().text if ok else None)
        if actions:
            self._detach(self._act_all(actions))

    def _barge_in(self) -> None:
        """Speech that interrupts (a BargeIn) stops the reply streaming, if any, and the audio
        still playing (the door tells the client)."""
        if not self.vad_cfg.barge_in:
            return
        self.playout.stop()
        if self.turn is not None and self._replying():
            self._cancel(self.turn, "interrupted")

    def _start_turn(self, ended: TurnEnded) -> None:
        """An utterance is over: transcribe it (or take the early decode that already did) and
        answer it, after the turn before it has unwound. Short speech over a running reply
        (``ended.overlap``) is screened first: a backchannel leaves the reply alone."""
        early = self.decodes.pop(ended.early_decode, None) if ended.early_decode else None
        ahead = self.ahead.pop(ended.early_decode, None) if ended.early_decode else None
        if early is not None and not early.started:
            early.drop()  # still queued: a final job (higher priority) replaces it
            early = None
        asr = early if early is not None else self.svc.asr.submit(ended.audio, FINAL)
        if ended.overlap:  # the reply may have ended meanwhile: a backchannel still needs no answer
            self._spawn(
                self._screen(ended, asr, early is not None, ahead),
                f"screen-{self.id}-{ended.turn_id}",
            )
            return
        self._answer(ended, asr, early is not None, ahead)

    async def _screen(
        self, ended: TurnEnded, asr: AsrHandle, early_asr: bool, ahead: Ahead | None
    ) -> None:
        """Speech over a reply that has not interrupted it yet: a backchannel ("mm-hm") is let
        go (the reply goes on, nothing joins the conversation); anything else interrupts now and
        is answered."""
        try:
            transcript = await asyncio.shield(asr.future)
        except asyncio.CancelledError:
            asr.drop()
            if ahead is not None:
                self._withdraw(ahead)
            raise
        except Exception:
            transcript = None  # the turn reports the failure
        if transcript is not None and (is_backchannel(transcript.text) or not transcript.text):
            self.svc.metrics.overlaps.labels("backchannel").inc()
            log.debug("session %s: backchannel %r over the reply", self.id, transcript.text)
            if ahead is not None:
                self._withdraw(ahead)
            return
        self.svc.metrics.overlaps.labels("interruption").inc()
        await self._act(ev.BargeIn(ended.turn_id))
        self._answer(ended, asr, early_asr, ahead)

    def _answer(
        self, ended: TurnEnded, asr: AsrHandle, early_asr: bool, ahead: Ahead | None
    ) -> None:
        trace = TurnTrace(ended.turn_id)
        heard = ended.endpoint_ns if ended.heard_ns is None else ended.heard_ns
        # on the caller's clock: when the audio was made, not when it was handled (audio/clock.py)
        trace.mark(Point.VOICE_END, ended.voice_end_ns - ended.voice_lag_ns)
        trace.mark(Point.ENDPOINT_AUDIO, heard - ended.lag_ns)
        trace.mark(Point.ENDPOINT, ended.endpoint_ns)
        if ended.heard_ns is not None:
            trace.mark(Point.ENDPOINT_HEARD, ended.heard_ns)
        previous = self.turn
        if previous is not None and previous.task is not None and not previous.task.done():
            self._cancel(previous, "interrupted")
        turn = Turn(ended.turn_id, trace)
        turn.early_asr = early_asr
        turn.early_prefill = early_asr and ahead is not None
        if ahead is not None and ahead.stream is not None:
            if early_asr:
                turn.ahead = ahead  # _reply takes it if the conversation still fits it
            else:
                self._withdraw(ahead)
        turn.task = asyncio.create_task(
            self._run_turn(turn, asr, previous), name=f"turn-{self.id}-{turn.turn_id}"
        )
        self.turn = turn

    # ------------------------------------------------------------ turns

    def cancel_response(self) -> None:
        """The client stops the reply (and its audio: it no longer holds the floor)."""
        self.playout.stop()
        if self.turn is not None and self.turn.task is not None and not self.turn.task.done():
            self._cancel(self.turn, "cancelled")

    def _cancel(self, turn: Turn, reason: str) -> None:
        """Stop a turn. While a request is in the engine, the engine is asked to stop and the turn
        ends when the engine confirms (within one step, state freed); otherwise (before it, or
        while tools run between rounds) the task is cancelled outright (a tool already running on
        a thread finishes there, unheard)."""
        if turn.cancel_requested:
            return
        turn.cancel_requested = True
        turn.cancel_reason = reason
        if turn.reply is not None and turn.reply.outcome is None:
            turn.reply.cancel(reason)
        elif turn.task is not None:
            turn.task.cancel()

    async def _run_turn(self, turn: Turn, asr: AsrHandle, previous: Turn | None) -> None:
        try:
            await self._transcribe_and_reply(turn, asr, previous)
        finally:
            if turn.ahead is not None:  # no reply took it (no speech found, an error, a cancel)
                self._withdraw(turn.ahead)
                turn.ahead = None

    async def _transcribe_and_reply(
        self, turn: Turn, asr: AsrHandle, previous: Turn | None
    ) -> None:
        try:
            if previous is not None and previous.task is not None:
                await asyncio.gather(previous.task, return_exceptions=True)  # its history first
            if self.svc.draining:
                await self.emit(
                    ev.SessionError(
                        ErrorCode.SHUTTING_DOWN.value,
                        "server is shutting down; no new turns",
                        fatal=False,
                    )
                )
                return
            transcript = await asyncio.shield(asr.future)
        except asyncio.CancelledError:
            asr.drop()
            raise
        except Exception as exc:
            if isinstance(exc, SpeechUnavailable):  # stopping, or the speech host restarting
                log.warning("session %s: ASR failed: %s", self.id, exc)
            else:
                log.exception("session %s: ASR failed", self.id)
            await self.emit(
                ev.SessionError(ErrorCode.ASR_FAILED.value, f"transcription failed: {exc}")
            )
            return
        trace = turn.trace
        trace.mark(Point.TRANSCRIPT)
        trace.mark(Point.ASR_START, transcript.start_ns)
        trace.mark(Point.ASR_DONE, transcript.start_ns + int(transcript.decode_ms * 1e6))
        if not transcript.text:
            await self.emit(ev.TranscriptFinal(turn.turn_id, ""))
            return  # no speech found: no reply
        item = self.history.add(Role.USER, transcript.text[: self.history.max_text_chars])
        await self.emit(
            ev.TranscriptFinal(turn.turn_id, transcript.text, item.item_id, transcript.language)
        )
        if self.auto_respond:
            await self._reply(turn)

    async def _run_response(
        self, turn: Turn, previous: Turn | None, max_new_tokens: int | None
    ) -> None:
        if previous is not None and previous.task is not None:
            await asyncio.gather(previous.task, return_exceptions=True)
        if self.svc.draining:
            await self.emit(
                ev.SessionError(
                    ErrorCode.SHUTTING_DOWN.value,
                    "server is shutting down; no new turns",
                    fatal=False,
                )
            )
            return
        await self._reply(turn, max_new_tokens)

    def _messages(self, user_text: str) -> list[ChatMessage]:
        return [
            ChatMessage("system", self.system_prompt),
            *self.history.messages(),
            ChatMessage("user", user_text),
        ]

    def _speech_out(self, turn: Turn) -> SpeechOut | None:
        fmt, worker = self.settings.output_audio, self.svc.tts
        if fmt is None or worker is None or turn.speak is False:
            return None

        async def send(chunk: AudioOut) -> None:  # numbered across the reply's rounds
            seq, turn.audio_seq = turn.audio_seq, turn.audio_seq + 1
            now = now_ns()
            if self.echo is not None:  # what the caller's microphone may hear again
                self.echo.reference(chunk.samples, fmt.sample_rate, now)
            self.playout.add(chunk.samples.size * 1_000_000_000 // fmt.sample_rate, now)
            await self.emit(ev.ReplyAudio(turn.turn_id, seq, chunk.audio, chunk.text))

        tts = self.cfg.tts
        return SpeechOut(
            worker, fmt, send, turn.trace, tts.first_clause_chars, tts.first_piece_words, self.voice
        )

    def _request(
        self,
        turn: Turn | None,
        max_new_tokens: int | None,
        round_: int,
        user_text: str | None = None,
    ) -> GenerationRequest:
        """The engine request for one round of a reply. The first round uses the turn's (else the
        session's) tool_choice; later rounds, after tool outputs, let the model choose (``auto``:
        a forced choice would call again forever), and the last allowed round offers no tool.
        ``turn`` None: an audio turn's; ``user_text``: with that user message added to the
        conversation, as the history will add it (the reply started ahead)."""
        messages = [
            ChatMessage("system", (turn and turn.system_prompt) or self.system_prompt),
            *self.history.messages(),
        ]
        if user_text is not None:
            messages.append(ChatMessage("user", user_text[: self.history.max_text_chars]))
        tools = self.offered_tools(turn.tools if turn else None)
        choice = ((turn and turn.tool_choice) or self.tool_choice) if round_ == 0 else ToolChoice()
        if round_ >= self.cfg.tools.max_rounds or choice.mode is ToolChoiceMode.NONE:
            tools, choice = (), ToolChoice()
        return GenerationRequest(
            f"{self.id}-{next(_request_ids)}",
            messages,
            max_new_tokens or self.max_new_tokens,
            self.id,
            tools=tools,
            tool_choice=choice,
            parallel_tool_calls=self.cfg.tools.parallel,
            sampling=self._sampling(),
        )

    def _sampling(self) -> Sampling:
        """The replies' decoding: greedy (the voice default) unless the session asked for a
        temperature, then with its top_p, top_k and seed (each reply draws from the seed anew)."""
        st = self.settings
        if not st.temperature:
            return GREEDY
        return Sampling(st.temperature, st.top_p or 1.0, st.top_k or 0, st.seed)

    async def _reply(self, turn: Turn, max_new_tokens: int | None = None) -> None:
        """Generate (and, when asked for, speak) the reply to the conversation in ``history``;
        what was sent joins the history, the turn's latency is recorded and announced. A reply
        that calls server-side tools runs them and goes on with their outputs (up to
        ``tools.max_rounds`` rounds); one that calls a client's tool ends, and the client sends
        the output and asks for the rest."""
        tally = ReplyTally()
        server = self._server_tools
        out: ReplyOutcome | None = None
        try:
            for round_ in range(self.cfg.tools.max_rounds + 1):
                request = self._request(turn, max_new_tokens, round_)
                stream, request = self._take_ahead(turn, request)
                reply = turn.reply = Reply(
                    self.svc.engine,
                    request,
                    turn.turn_id,
                    turn.trace,
                    self.emit,
                    self._speech_out(turn),
                    _Ids(self.history),
                    server,
                    announce=round_ == 0,
                    stream=stream,
                )
                try:
                    await reply.run()
                finally:
                    out = reply.outcome
                    if out is not None:
                        tally.add(out, self._keep(out))
                if out is None:  # (run() returned: it always leaves an outcome)
                    break
                if out.broken_calls:
                    await self.emit(
                        ev.SessionError(
                            ErrorCode.INVALID.value,
                            f"{out.broken_calls} tool call(s) cut off ({out.reason}); not made",
                            fatal=False,
                        )
                    )
                if not out.calls or not _calls_stand(out.reason) or turn.cancel_requested:
                    break
                if any(c.name not in server for c in out.calls):
                    tally.waiting = tuple(c.call_id for c in out.calls if c.name not in server)
                    await self._run_tools(turn, [c for c in out.calls if c.name in server], tally)
                    break
                await self._run_tools(turn, list(out.calls), tally)
                if turn.cancel_requested:
                    break
            if (
                out is not None
                and out.reason == FinishReason.ERROR
                and not tally.texts
                and not turn.cancel_requested
                and self.cfg.llm.apology
            ):
                await self._say_aside(turn, tally, self.cfg.llm.apology)
        finally:
            if out is not None:
                await self._reply_done(turn, out, tally)

    def _take_ahead(self, turn: Turn, request: GenerationRequest):
        """(the stream started ahead and its request, when it asked exactly ``request``; else
        (None, ``request``), the one started ahead withdrawn)."""
        ahead, turn.ahead = turn.ahead, None
        if ahead is None:
            return None, request
        if ahead.fits(request):
            return ahead.stream, ahead.request
        self._withdraw(ahead)
        return None, request

    def _keep(self, out: ReplyOutcome) -> Item | None:
        """What a round sent joins the history: its text, then its calls. The text item, if any."""
        item = (
            self.history.add(Role.ASSISTANT, out.text[: self.history.max_text_chars])
            if out.text
            else None
        )
        for call in out.calls:
            self.history.add_call(call, out.call_items.get(call.call_id))
        return item

    async def _run_tools(self, turn: Turn, calls: list, tally: ReplyTally) -> None:
        """Run the server-side calls at once, each with the toolbox's timeout; their outputs join
        the history and are announced. If they take longer than ``tools.filler_after_ms``, the
        filler is said (once) meanwhile."""
        toolbox = self.svc.toolbox
        if not calls or toolbox is None:  # (calls are of server-side tools: it is there)
            return
        runs = [asyncio.ensure_future(toolbox.run(c)) for c in calls]
        try:
            done, _ = await asyncio.wait(runs, timeout=self.cfg.tools.filler_after_ms / 1000)
            if len(done) < len(runs) and self.cfg.tools.filler:
                await self._say_aside(turn, tally, self.cfg.tools.filler)
            outcomes = await asyncio.gather(*runs)
        finally:
            for run in runs:
                run.cancel()
        for call, result in zip(calls, outcomes):
            item = self.history.add_output(
                call.call_id, result.output[: self.history.max_text_chars]
            )
            self.svc.metrics.tool_calls.labels("error" if result.error else "ok").inc()
            self.svc.metrics.tool_seconds.observe(result.seconds)
            await self.emit(
                ev.ToolResult(turn.turn_id, call.call_id, result.output, item.item_id, result.error)
            )

    async def _say_aside(self, turn: Turn, tally: ReplyTally, text: str) -> None:
        """Words of the server's own (the filler while tools run, the apology for a failed reply):
        sent as text and spoken when the reply is; in the reply's text, never in the history."""
        await self.emit(ev.ReplyToken(turn.turn_id, -1, text))
        tally.texts.append(text)
        speech = self._speech_out(turn)
        if speech is not None:
            speech.feed(text)
            speech.finish()
            await speech.wait()

    def _last_said(self) -> str:
        """The caller's last message (what the reply answers), for the turn's record."""
        return next((m.content for m in reversed(self.history.messages()) if m.role == "user"), "")

    async def _reply_done(self, turn: Turn, out: ReplyOutcome, tally: ReplyTally) -> None:
        reason = turn.cancel_reason if turn.cancel_requested else out.reason
        record = TurnRecord.from_trace(
            turn.trace,
            self.id,
            reason,
            tally.tokens,
            self.cfg.telemetry.budget_ms,
            self._last_said(),
        )
        self.svc.metrics.observe_turn(record)
        if self.svc.spans is not None:
            self.svc.spans.turn(turn.trace, record, out.prompt_tokens)
        stages = record.stages
        log.info(
            "turn %s/%d %s tokens=%d prompt=%d %s",
            self.id,
            turn.turn_id,
            reason,
            tally.tokens,
            tally.prompt_tokens,
            " ".join(f"{k}={v:.1f}" for k, v in stages.items()),
        )
        await self.emit(
            ev.ReplyDone(
                turn.turn_id,
                tally.text,
                tally.tokens,
                tally.prompt_tokens,
                ev.ReplyEnd(reason),
                tally.item_id,
                tally.waiting,
                tally.item_offset,
            )
        )
        await self.emit(ev.TurnLatency(turn.turn_id, stages, turn.early_asr, turn.early_prefill))

    def idle(self) -> bool:
        """No turn or reply is running."""
        turn = self.turn
        return turn is None or turn.task is None or turn.task.done()

    async def wait_turn(self, timeout: float | None = None) -> bool:
        """Wait for the running turn (if any) to finish; False on timeout."""
        turn = self.turn
        if turn is None or turn.task is None or turn.task.done():
            return True
        done, _ = await asyncio.wait({turn.task}, timeout=timeout)
        return bool(done)

    async def close(self, reason: str = "cancelled") -> None:
        """Stop the running turn (the engine frees its request) and wait until it has unwound;
        withdraw the decodes and warm prefills still in flight."""
        for action in self.turns.clear():
            self._act_now(action)
        for task in list(self.judging):
            task.cancel()
        if self.denoiser is not None:
            self.denoiser.close()
            self.denoiser = None
        turn = self.turn
        if turn is not None and turn.task is not None and not turn.task.done():
            self._cancel(turn, reason)
            await asyncio.gather(turn.task, return_exceptions=True)
