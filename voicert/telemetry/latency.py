"""The one home of latency: the points a turn passes and the stage intervals between them.

Other modules only *mark points* on a :class:`TurnTrace` (``trace.mark(Point.ENDPOINT)``), always from
``time.perf_counter_ns()``. Every interval reported anywhere (``turn.latency``, logs, benchmarks) is
computed here from those points, by the table :data:`STAGES`, so each is defined exactly once.
"""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field


class Point(enum.Enum):
    """Instants in one turn, in the order a turn normally passes them."""

    VOICE_END = "voice_end"
    """The caller made the audio frame holding the last voiced VAD window of the utterance: its
    arrival, less the session's ingest lag then (audio/clock.py)."""
    ASR_START = "asr_start"
    """The ASR worker began decoding the utterance that became the final transcript (before the
    endpoint when the early final decode was used)."""
    ENDPOINT_HEARD = "endpoint_heard"
    """Arrival of the audio frame that completed the VAD window the silence rule ended the turn on
    (not marked when a commit or a turn judgement ended it)."""
    ENDPOINT_AUDIO = "endpoint_audio"
    """The caller made the audio the endpoint decision rests on (the frame completing the last
    window scored; for a commit, the last frame before it): its arrival less its ingest lag.
    For a reply asked for by a message, the endpoint itself."""
    ENDPOINT = "endpoint"
    """The endpoint decision: enough trailing silence, or ``audio.commit``."""
    ASR_DONE = "asr_done"
    """The ASR worker finished that decode."""
    TRANSCRIPT = "transcript"
    """The final transcript is back on the event loop from the ASR worker thread."""
    SUBMIT = "submit"
    """The request was handed to the LLM engine (``Engine.submit``)."""
    PREFILL_START = "prefill_start"
    """The engine thread picked the request up and began building its prompt and prefill."""
    FIRST_TOKEN_SAMPLED = "first_token_sampled"
    """The engine thread sampled the first output token (prefill forward + sampling done)."""
    FIRST_TOKEN_RECEIVED = "first_token_received"
    """The session's asyncio task received the first token event from the engine thread."""
    FIRST_TOKEN_SENT = "first_token_sent"
    """The frame carrying the first ``response.token`` was written to the socket."""
    TTS_START = "tts_start"
    """The reply's first speakable piece (sentence or clause) was handed to the TTS worker."""
    TTS_TAKEN = "tts_taken"
    """A TTS thread began speaking the reply's first piece."""
    TTS_FIRST_CHUNK = "tts_first_chunk"
    """The voice handed out the first piece's first chunk of audio (on the TTS thread)."""
    FIRST_AUDIO_SENT = "first_audio_sent"
    """The frame carrying the reply's first speech audio was written to the socket."""
    TOOL_CALL = "tool_call"
    """The reply's first tool call was complete (its arguments decoded and sent)."""
    DONE = "done"
    """The last token was sent and ``response.done`` written."""


@dataclass(frozen=True, slots=True)
class Stage:
    name: str
    start: Point
    end: Point
    doc: str


STAGES: tuple[Stage, ...] = (
    Stage(
        "endpoint_ms",
        Point.VOICE_END,
        Point.ENDPOINT_AUDIO,
        "the caller's last voiced audio -> the audio the endpoint was decided on, both on the "
        "caller's clock (mostly the configured trailing silence)",
    ),
    Stage(
        "ingest_ms",
        Point.ENDPOINT_AUDIO,
        Point.ENDPOINT,
        "the caller made the audio the endpoint was decided on -> the decision: how late the "
        "server handled it (socket, event loop, worker, VAD or speech-host backlog) and scored it",
    ),
    Stage(
        "decide_ms",
        Point.ENDPOINT_HEARD,
        Point.ENDPOINT,
        "the frame completing the VAD window the turn ended at arrived -> endpoint decision (the "
        "VAD's batch and the event loop's wait: the part of endpoint_ms the silence rule or the "
        "judgement does not set)",
    ),
    Stage(
        "asr_ms",
        Point.ENDPOINT,
        Point.TRANSCRIPT,
        "endpoint decision -> final transcript back on the event loop",
    ),
    Stage(
        "asr_wait_ms",
        Point.ENDPOINT,
        Point.ASR_START,
        "endpoint decision -> final decode began (negative: an early decode began before the "
        "endpoint and was confirmed)",
    ),
    Stage(
        "asr_decode_ms",
        Point.ASR_START,
        Point.ASR_DONE,
        "the final transcript's decode on the ASR worker",
    ),
    Stage(
        "dispatch_ms",
        Point.TRANSCRIPT,
        Point.SUBMIT,
        "final transcript on the event loop -> request handed to the engine (transcript sent, "
        "prompt assembled; negative: the reply was started ahead, on the early transcript)",
    ),
    Stage(
        "queue_ms",
        Point.SUBMIT,
        Point.PREFILL_START,
        "request handed to the engine -> engine thread starts on it",
    ),
    Stage(
        "prefill_ms",
        Point.PREFILL_START,
        Point.FIRST_TOKEN_SAMPLED,
        "engine starts the request -> first token sampled (tokenize + prefill forward + sample)",
    ),
    Stage(
        "handoff_ms",
        Point.FIRST_TOKEN_SAMPLED,
        Point.FIRST_TOKEN_RECEIVED,
        "first token sampled on the engine thread -> received by the session's asyncio task "
        "(with a reply started ahead, also its wait for the endpoint)",
    ),
    Stage(
        "first_token_ms",
        Point.SUBMIT,
        Point.FIRST_TOKEN_RECEIVED,
        "request handed to the engine -> first token received in asyncio (the engine's TTFT; "
        "with a reply started ahead, from its early submission)",
    ),
    Stage(
        "send_ms",
        Point.FIRST_TOKEN_RECEIVED,
        Point.FIRST_TOKEN_SENT,
        "first token received in asyncio -> its frame written to the socket",
    ),
    Stage(
        "ttft_ms",
        Point.ENDPOINT_AUDIO,
        Point.FIRST_TOKEN_SENT,
        "the audio the endpoint was decided on, on the caller's clock -> first token written to "
        "the socket (the budgeted figure: ingest_ms and the engine's part)",
    ),
    Stage(
        "voice_to_first_token_ms",
        Point.VOICE_END,
        Point.FIRST_TOKEN_SENT,
        "the caller's last voiced audio (on its clock) -> first token written to the socket",
    ),
    Stage(
        "tts_ms",
        Point.TTS_START,
        Point.FIRST_AUDIO_SENT,
        "first speakable piece handed to TTS -> its first audio written to the socket",
    ),
    Stage(
        "tts_wait_ms",
        Point.TTS_START,
        Point.TTS_TAKEN,
        "first speakable piece handed to TTS -> a TTS thread began it (the queue's wait)",
    ),
    Stage(
        "tts_synth_ms",
        Point.TTS_TAKEN,
        Point.TTS_FIRST_CHUNK,
        "a TTS thread began the first piece -> the voice handed out its first audio",
    ),
    Stage(
        "tts_out_ms",
        Point.TTS_FIRST_CHUNK,
        Point.FIRST_AUDIO_SENT,
        "the first piece's first audio made -> written to the socket (back to the event loop, "
        "resampled, encoded, sent)",
    ),
    Stage(
        "ttfa_ms",
        Point.ENDPOINT_AUDIO,
        Point.FIRST_AUDIO_SENT,
        "the audio the endpoint was decided on, on the caller's clock -> first reply audio "
        "written to the socket (time to first audio)",
    ),
    Stage(
        "voice_to_first_audio_ms",
        Point.VOICE_END,
        Point.FIRST_AUDIO_SENT,
        "the caller's last voiced audio (on its clock) -> first reply audio written to the socket",
    ),
    Stage(
        "token_to_audio_ms",
        Point.FIRST_TOKEN_SENT,
        Point.FIRST_AUDIO_SENT,
        "first token written -> first reply audio written (how far the speech trails the text)",
    ),
    Stage(
        "tool_call_ms",
        Point.ENDPOINT_AUDIO,
        Point.TOOL_CALL,
        "the audio the endpoint was decided on -> the first tool call's arguments complete",
    ),
    Stage(
        "total_ms",
        Point.ENDPOINT_AUDIO,
        Point.DONE,
        "the audio the endpoint was decided on -> reply finished",
    ),
)
STAGE_NAMES: tuple[str, ...] = tuple(s.name for s in STAGES)
# Back-to-back slices from the last voiced audio to the first token on the wire: they add up to
# voice_to_first_token_ms, so a waterfall of them shows where a turn's time went.
WATERFALL: tuple[str, ...] = (
    "endpoint_ms",
    "ingest_ms",
    "asr_ms",
    "dispatch_ms",
    "queue_ms",
    "prefill_ms",
    "handoff_ms",
    "send_ms",
)
# One colour per stage for every chart: the browser client, the dashboard (both read them from
# /stages.js, made by stages_js) and the load generator's plots.
STAGE_COLOURS: dict[str, str] = {
    "endpoint_ms": "#9e9e9e",
    "ingest_ms": "#8c6d31",
    "asr_ms": "#1f77b4",
    "dispatch_ms": "#17becf",
    "queue_ms": "#bcbd22",
    "prefill_ms": "#ff7f0e",
    "handoff_ms": "#9467bd",
    "send_ms": "#2ca02c",
    "asr_wait_ms": "#aec7e8",
    "asr_decode_ms": "#6baed6",
    "first_token_ms": "#e6550d",
    "ttft_ms": "#d62728",
    "voice_to_first_token_ms": "#8c564b",
    "tts_ms": "#e377c2",
    "tts_wait_ms": "#fcc5c0",
    "tts_synth_ms": "#fa9fb5",
    "tts_out_ms": "#dd3497",
    "ttfa_ms": "#c51b8a",
    "decide_ms": "#525252",
    "voice_to_first_audio_ms": "#7b4173",
    "tool_call_ms": "#637939",
    "total_ms": "#393b79",
    "token_to_audio_ms": "#f768a1",
}


def stages_js() -> str:
    """``/stages.js``: the stage table for the browser pages (names, waterfall order, colours,
    what each stage measures), as ``window.VOICERT_STAGES``."""
    import json

    table = {
        "waterfall": list(WATERFALL),
        "colours": STAGE_COLOURS,
        "docs": {s.name: s.doc for s in STAGES},
    }
    return f"window.VOICERT_STAGES = {json.dumps(table, indent=1)};\n"


def now_ns() -> int:
    """The monotonic clock every latency figure uses."""
    return time.perf_counter_ns()


@dataclass(slots=True)
class TurnTrace:
    """Monotonic timestamps (ns) of one turn's points. Marks are first-write-wins."""

    turn_id: int
    points: dict[Point, int] = field(default_factory=dict)

    def mark(self, point: Point, t_ns: int | None = None) -> None:
        if point not in self.points:
            self.points[point] = now_ns() if t_ns is None else t_ns

    def has(self, point: Point) -> bool:
        return point in self.points

    def stages_ms(self) -> dict[str, float]:
        """Every stage whose two points were both marked, in milliseconds (3 decimals)."""
        out = {}
        for stage in STAGES:
            a, b = self.points.get(stage.start), self.points.get(stage.end)
            if a is not None and b is not None:
                out[stage.name] = round((b - a) / 1e6, 3)
        return out


def format_table(
    rows: list[dict[str, float]],
    names: tuple[str, ...] = STAGE_NAMES,
    labels: list[str] | None = None,
) -> str:
    """A table in ms, one row per turn (labelled by ``labels`` or its index), one column per stage."""
    cols = [n for n in names if any(n in r for r in rows)]
    heads = [n.removesuffix("_ms") for n in cols]
    widths = [max(len(h), 8) + 2 for h in heads]
    labels = labels or [str(i) for i in range(len(rows))]
    lines = ["turn" + "".join(f"{h:>{w}}" for h, w in zip(heads, widths))]
    for label, r in zip(labels, rows):
        lines.append(
            f"{label:<4}"
            + "".join(f"{r[n]:>{w}.1f}" if n in r else f"{'-':>{w}}" for n, w in zip(cols, widths))
        )
    return "\n".join(lines)


SAID_CHARS = 80


@dataclass(slots=True)
class TurnRecord:
    """One finished turn, as dashboards and metrics see it."""

    session_id: str
    turn_id: int
    wall_time: float  # time.time() at the end, a label for charts only (never used for intervals)
    stages: dict[str, float]
    finish_reason: str
    tokens: int
    budget_ms: float
    ttft_ms: float | None = None
    dominant_stage: str | None = None  # the waterfall slice that took longest
    over_budget: bool = False  # ttft_ms above the configured budget
    said: str = ""  # the start of what the caller said (the dashboard's label for the turn)

    @classmethod
    def from_trace(
        cls,
        trace: TurnTrace,
        session_id: str,
        finish_reason: str,
        tokens: int,
        budget_ms: float,
        said: str = "",
    ) -> TurnRecord:
        stages = trace.stages_ms()
        slices = {k: stages[k] for k in WATERFALL if k in stages}
        ttft = stages.get("ttft_ms")
        return cls(
            session_id,
            trace.turn_id,
            time.time(),
            stages,
            finish_reason,
            tokens,
            budget_ms,
            ttft,
            max(slices, key=lambda name: slices[name]) if slices else None,
            ttft is not None and ttft > budget_ms,
            said[:SAID_CHARS],
        )

    def as_dict(self) -> dict:
        return {name: getattr(self, name) for name in self.__slots__}
