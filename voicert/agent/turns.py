"""Turn-taking for one session: audio and VAD probabilities in, decisions out.

Synchronous and pure: no asyncio, no models, no clock of its own. The session appends the audio it
received (16 kHz), scores VAD windows however it likes, and passes the probabilities in with the
time the audio arrived; :class:`TurnTaking` answers with what to do, as small typed actions:

- ``SpeechStarted`` / ``SpeechStopped`` (core events): tell the client (and barge in on a reply);
- :class:`StartDecode` / :class:`DropDecode`: run or withdraw an ASR decode (an *early* final decode
  in the trailing silence, or a *partial* decode of the utterance so far);
- :class:`TurnEnded`: the utterance is over (endpoint, or a manual commit): its audio, when the
  voice ended and the endpoint came, and the early decode that already covers exactly it, if any;
- ``TranscriptPartial`` (a core event): the stable / unstable words of live partials changed;
- :class:`JudgeTurn`: (semantic turn detection) score this utterance with the turn-completion model
  and pass the probability to :meth:`TurnTaking.judged`;
- :class:`BargeIn`: the speaker talks over the agent: stop the reply (and the audio still playing).

With ``turn.backchannels`` speech that starts while a reply runs does not interrupt at once: it
does once it has gone on for ``turn.interrupt_ms``; a shorter utterance ends as a turn marked
``overlap``, and the session interrupts only if its transcript is not a backchannel ("mm-hm").
With ``turn.interrupt_check_ms`` the speech that reaches ``interrupt_ms`` is transcribed first (an
*overlap* decode, :meth:`TurnTaking.overlap_done`): a slow backchannel ("mm-hmmm") lets the reply go
on; other words, a failed decode, or none within ``interrupt_check_ms``, interrupt.

With ``turn.detector: semantic`` an utterance is judged at a short pause (``turn.pause_ms``): from
the audio model's probability and the early transcript's last words (``turn.text_cue``, passed in
with :meth:`TurnTaking.early_done`). Complete: the turn ends there. Incomplete: the endpointer waits
for more speech up to ``turn.max_silence_ms`` of silence.

With ``turn.detector: hazard`` the pause is judged the same way, but from the audio model and
the LLM's end-of-turn score of the early transcript (:class:`ScoreText`, answered with
:meth:`TurnTaking.text_scored`), combined into one hazard (agent/hazard.py): the verdict is not
complete / incomplete but the silence after which the turn ends, which may be now; the caller's
own pauses inside turns (:class:`~voicert.agent.hazard.PauseHabit`) stretch it.

Tests drive it with scripted probabilities and times (tests/agent/test_turns.py).
"""

from __future__ import annotations

import dataclasses
import enum
import itertools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Union

import numpy as np

from voicert.agent.hazard import Evidence, PauseHabit, bare, end_after_ms, text_cues
from voicert.audio.buffer import AudioBuffer
from voicert.config import TurnConfig, VadConfig
from voicert.core.events import BargeIn, SpeechStarted, SpeechStopped, TranscriptPartial
from voicert.core.speech import Ending
from voicert.speech.endpoint import WINDOW_MS, Endpointer, EventKind
from voicert.speech.partials import LocalAgreement
from voicert.speech.turn_text import continues, is_backchannel
from voicert.speech.vad import FRAME, SAMPLE_RATE


class Detection(enum.StrEnum):
    SERVER_VAD = "server_vad"  # the endpointer ends turns
    MANUAL = "manual"  # the client commits (push-to-talk)


class DecodeKind(enum.Enum):
    EARLY = "early"  # the final decode, started in the trailing silence before the endpoint
    PARTIAL = "partial"  # a live partial of the utterance so far
    OVERLAP = "overlap"  # speech over a reply that reached turn.interrupt_ms: a backchannel?


@dataclass(frozen=True, slots=True)
class StartDecode:
    decode_id: int
    kind: DecodeKind
    audio: np.ndarray  # [N] float32 16 kHz: the utterance so far


@dataclass(frozen=True, slots=True)
class DropDecode:
    decode_id: int
    kind: DecodeKind


@dataclass(frozen=True, slots=True)
class TurnEnded:
    turn_id: int
    audio: np.ndarray  # [N] float32 16 kHz: the whole utterance
    voice_end_ns: int  # arrival of the audio holding its last voiced window (endpoint_ns if none)
    endpoint_ns: int
    early_decode: int | None  # the early decode covering exactly this audio, if still valid
    overlap: bool = False  # short speech over a reply that has not interrupted it (yet)
    heard_ns: int | None = None  # arrival of the audio completing the window the turn ended at,
    #                              by the silence rule or a judgement (None: ended by a commit)
    voice_lag_ns: int = 0  # the ingest lag of the audio holding the last voiced window
    lag_ns: int = 0  # the ingest lag of the last audio handled when the turn ended


@dataclass(frozen=True, slots=True)
class JudgeTurn:
    judge_id: int
    audio: np.ndarray  # [N] float32 16 kHz: the utterance up to the pause


@dataclass(frozen=True, slots=True)
class ScoreText:
    """(hazard) Score the early transcript with the LLM: P(end of message) after ``text`` (and
    its end-of-turn head's P(over), where it has one; where not, P(end) after ``bare``, without
    its final punctuation); answer with :meth:`TurnTaking.text_scored`."""

    judge_id: int
    text: str
    bare: str


class Verdict(enum.StrEnum):
    COMPLETE = "complete"
    INCOMPLETE = "incomplete"


@dataclass(frozen=True, slots=True)
class TurnJudged:
    judge_id: int
    verdict: Verdict  # complete: the TurnEnded follows
    late: tuple[str, ...] = ()  # opinions not in by turn.decide_by_ms, decided without:
    #                              "audio", "text" (the early transcript), "score" (the LLM's)


Action = Union[
    SpeechStarted,
    SpeechStopped,
    StartDecode,
    DropDecode,
    TurnEnded,
    TranscriptPartial,
    JudgeTurn,
    ScoreText,
    TurnJudged,
    BargeIn,
]


@dataclass(slots=True)
class _Early:
    decode_id: int
    last_voiced: int  # endpointer window of the last voiced audio it covers
    utterance_start: int
    text: str | None = None  # its transcript, once in (the text cue of a semantic judgement)
    ending: Ending | None = None  # what the recogniser would write after its last word


@dataclass(slots=True)
class _Judgement:
    judge_id: int
    need_audio: bool  # the audio model's probability is awaited
    need_text: bool  # the early decode's transcript is awaited
    prob: float | None = None
    pause_prob: float | None = None  # (hazard) the audio model's pause head's P(complete)
    text: str | None = None
    verdict: Verdict | None = None  # once decided (incomplete: the endpointer's maximum decides)
    need_score: bool = False  # (hazard) the LLM's scores of the transcript are awaited
    text_prob: float | None = None
    bare_prob: float | None = None
    head_prob: float | None = None
    ending: Ending | None = None  # (hazard) the early transcript's, once in
    end_after_ms: float | None = None  # (hazard) the silence that ends the turn, once decided
    late: bool = False  # decided at turn.decide_by_ms without every opinion: a late one may
    #                     still shorten the wait, never lengthen it

    def awaited(self) -> tuple[str, ...]:
        """The opinions still awaited."""
        return tuple(
            name
            for name, waiting in (
                ("audio", self.need_audio),
                ("text", self.need_text and self.text is None),
                ("score", self.need_score),
            )
            if waiting
        )


@dataclass(slots=True)
class _OverlapCheck:
    decode_id: int
    deadline_ns: int  # no transcript by then: interrupt


@dataclass(slots=True)
class _Partials:
    agreement: LocalAgreement
    utterance_start: int
    next_window: int  # no new partial decode before this endpointer window
    in_flight: int | None = None  # decode id
    sent: tuple[str, str] = ("", "")


class TurnTaking:
    """``early_final_ms``: start the final decode after this much trailing silence (0: off; only
    with server VAD and auto-respond). ``partial_interval_ms``: a partial decode this often while
    speech goes on (0: off). ``turn``: when an utterance is over (default: after
    ``vad.min_silence_ms`` of silence)."""

    def __init__(
        self,
        vad: VadConfig,
        detection: Detection = Detection.SERVER_VAD,
        early_final_ms: int = 0,
        partial_interval_ms: int = 0,
        auto_respond: bool = True,
        turn: TurnConfig | None = None,
        score_text: bool = False,
    ) -> None:
        """``score_text``: (hazard) the engine scores transcripts (``Engine.scores``): pauses are
        judged on the LLM's end-of-turn score too."""
        self.vad = vad
        self.score_text = score_text
        self.habit = PauseHabit()
        self.turn = turn or TurnConfig()
        self.detection = detection
        self.early_final_ms = early_final_ms
        self.partial_interval_ms = partial_interval_ms
        self.auto_respond = auto_respond
        self.endpointer = Endpointer(self._endpointer_vad())
        self.audio = AudioBuffer()
        self.utterance_start = 0  # absolute 16 kHz sample where the current utterance starts
        self.last_voice_ns = 0
        self.last_voice_lag_ns = 0  # the ingest lag of that audio (audio/clock.py)
        self._lag_ns = 0  # the ingest lag of the audio handled last
        self.next_turn_id = 1  # the id the utterance in progress will get
        self._ids = itertools.count(1)
        self._early: _Early | None = None
        self._partials: _Partials | None = None
        self._judgement: _Judgement | None = None
        self._heard_ns: int | None = None  # arrival of the audio completing the last scored window
        self._overlap_voiced: int | None = None  # voiced windows of speech over a reply, held
        self._overlap_check: _OverlapCheck | None = None  # its transcript, awaited

    @property
    def semantic(self) -> bool:
        """Utterances are judged at a pause (not only ended by silence)."""
        return self.turn.detector != "silence" and self.detection is Detection.SERVER_VAD

    @property
    def hazard(self) -> bool:
        """Judged pauses end the turn after a silence the hazard sets (not complete / not)."""
        return self.semantic and self.turn.detector == "hazard"

    @property
    def judges_text(self) -> bool:
        """A pause's judgement waits for the early transcript (the word cue, or the hazard's
        LLM score of it): the early decode must be in by the pause."""
        return self.semantic and (self.turn.text_cue or self.hazard)

    def _endpointer_vad(self) -> VadConfig:
        # semantic: the endpointer's silence is the maximum; the judgement ends turns earlier
        if self.turn.detector == "silence":
            return self.vad
        return dataclasses.replace(self.vad, min_silence_ms=self.turn.max_silence_ms)

    # ------------------------------------------------------------ settings

    def reconfigure(
        self,
        vad: VadConfig,
        detection: Detection,
        auto_respond: bool,
        turn: TurnConfig | None = None,
    ) -> None:
        """New settings (Realtime ``session.update``); new VAD or turn settings reset the
        endpointer."""
        turn = turn or self.turn
        if vad != self.vad or turn != self.turn:
            self.vad, self.turn = vad, turn
            self.endpointer = Endpointer(self._endpointer_vad())
            self._judgement = None
        self.detection = detection
        self.auto_respond = auto_respond

    def new_turn_id(self) -> int:
        """Take a turn id for a turn that is not an utterance (a reply asked for by text)."""
        turn_id, self.next_turn_id = self.next_turn_id, self.next_turn_id + 1
        return turn_id

    # ------------------------------------------------------------ audio

    def push(self, x16: np.ndarray) -> None:
        """Audio received (16 kHz float32 [N]), before its VAD windows are scored."""
        self.audio.append(x16)

    def on_windows(
        self,
        probs: np.ndarray,
        received_ns: int,
        decided_ns: int,
        asr_busy: Callable[[], bool] = lambda: False,
        replying: bool = False,
        lag_ns: int = 0,
    ) -> list[Action]:
        """Speech probabilities of the VAD windows the last pushed audio completed, in order.
        ``received_ns``: when that audio arrived; ``decided_ns``: now (the windows were scored).
        ``asr_busy``: whether the ASR worker has work queued (partials back off then).
        ``replying``: a reply is being generated or sent (speech may be a backchannel).
        ``lag_ns``: how late that audio was handled (its ingest lag: audio/clock.py)."""
        out: list[Action] = []
        self._heard_ns, self._lag_ns = received_ns, lag_ns
        for prob in probs:
            ep = self.endpointer
            gap_ms = ep.silence_ms if ep.in_speech else 0
            result = ep.step(float(prob))
            if result.voiced and ep.in_speech and gap_ms >= self.turn.pause_ms:
                self.habit.observe(gap_ms)  # a pause inside the turn, after which they went on
            if result.voiced and self._overlap_voiced is not None and self.endpointer.in_speech:
                self._overlap_voiced += 1
                if self._overlap_voiced * WINDOW_MS >= self.turn.interrupt_ms:
                    self._overlap_long(received_ns, out)
            self._overlap_overdue(decided_ns, out)
            if result.voiced:
                self.last_voice_ns, self.last_voice_lag_ns = received_ns, lag_ns
                self._drop_early(out)  # the user kept talking: the early decode is stale
                self._judgement = None  # and a judgement of the pause is moot
            elif result.event is None:
                self._maybe_start_early(out)
                if self._maybe_judge(out, decided_ns):
                    continue  # the judgement ended the turn
            if result.event is None:
                self._maybe_partial(out, asr_busy)
                continue
            pos = result.event.window * FRAME
            if result.event.kind is EventKind.SPEECH_STARTED:
                pad = self.vad.speech_pad_ms * SAMPLE_RATE // 1000
                self.utterance_start = max(pos - pad, self.audio.base)
                out.append(SpeechStarted(self.next_turn_id, pos * 1000 // SAMPLE_RATE))
                if replying and self.turn.backchannels:
                    self._overlap_voiced = self.endpointer.window - result.event.window + 1
                else:
                    out.append(BargeIn(self.next_turn_id))
            else:
                end = pos + FRAME
                out.append(SpeechStopped(self.next_turn_id, end * 1000 // SAMPLE_RATE))
                if self.detection is Detection.SERVER_VAD:
                    self._end_turn(end, decided_ns, out, heard_ns=received_ns)
        self._trim()
        return out

    def commit(self, now_ns: int) -> list[Action]:
        """The client ends the turn (push-to-talk): everything since the last turn (or since speech
        started). No TurnEnded when there was no audio to transcribe."""
        self.endpointer.reset()
        self._judgement = None
        if self.detection is not Detection.SERVER_VAD:
            self.utterance_start = self.audio.base
        out: list[Action] = []
        self._end_turn(self.audio.end, now_ns, out)
        return out

    def clear(self) -> list[Action]:
        """Forget the input audio not yet turned into a turn (and any decode begun on it)."""
        out: list[Action] = []
        self._drop_early(out)
        self._drop_partials(out)
        self._judgement = None
        self._overlap_voiced = None
        self._drop_overlap_check(out)
        self.endpointer.reset()
        self.audio.trim_before(self.audio.end)
        self.utterance_start = self.audio.end
        return out

    # ------------------------------------------------------------ decode results

    def early_is_current(self, decode_id: int) -> bool:
        """Whether that early decode still stands for the utterance in progress."""
        return self._early is not None and self._early.decode_id == decode_id

    def early_done(
        self, decode_id: int, text: str | None, now_ns: int, ending: Ending | None = None
    ) -> list[Action]:
        """An early decode finished (``text`` None: it failed; ``ending``: the recogniser's
        opinion of what follows its last word, if it gave one). Its transcript is the text cue
        of a judgement of the same pause; may end the turn."""
        early = self._early
        if early is None or early.decode_id != decode_id:  # (early_is_current)
            return []
        early.text, early.ending = text or "", ending
        st = self._judgement
        if st is None or not st.need_text or st.text is not None:
            return []
        st.text, st.ending = text or "", ending
        out: list[Action] = []
        if self.hazard and self.score_text and st.text.strip():
            st.need_score = True
            out.append(ScoreText(st.judge_id, st.text.strip(), bare(st.text)))
        return out + self._decide(now_ns)

    def text_scored(
        self,
        judge_id: int,
        text_prob: float | None,
        bare_prob: float | None,
        now_ns: int,
        head_prob: float | None = None,
    ) -> list[Action]:
        """The LLM's P(end of message) for a :class:`ScoreText`, as written and bare, and its
        end-of-turn head's P(over) where it has one (None: not asked, or failed; the hazard
        does without). May end the turn."""
        st = self._judgement
        if st is None or st.judge_id != judge_id or not st.need_score:
            return []
        st.need_score, st.text_prob, st.bare_prob = False, text_prob, bare_prob
        st.head_prob = head_prob
        return self._decide(now_ns)

    def judged(
        self, judge_id: int, prob: float | None, now_ns: int, pause: float | None = None
    ) -> list[Action]:
        """The turn-completion model's P(complete) for a :class:`JudgeTurn` (None: it failed; the
        text cue alone decides), and its pause head's (the hazard weighs it; None: no head). May
        end the turn: SpeechStopped and TurnEnded."""
        st = self._judgement
        if st is None or st.judge_id != judge_id or not st.need_audio:
            return []
        st.need_audio, st.prob, st.pause_prob = False, prob, pause
        return self._decide(now_ns)

    def overlap_done(self, decode_id: int, text: str | None) -> list[Action]:
        """The transcript of speech over a reply that reached ``interrupt_ms`` (``text`` None: the
        decode failed). A backchannel lets the reply go on (and is checked again after another
        ``interrupt_ms`` of speech); anything else interrupts it."""
        check = self._overlap_check
        if check is None or check.decode_id != decode_id:
            return []
        self._overlap_check = None
        if text is not None and (not text.strip() or is_backchannel(text)):
            self._overlap_voiced = 0
            return []
        out: list[Action] = []
        self._interrupt(out)
        return out

    def partial_done(self, decode_id: int, text: str | None) -> list[Action]:
        """A partial decode finished (``text`` None: it failed or was dropped)."""
        st = self._partials
        if st is None or st.in_flight != decode_id:
            return []
        st.in_flight = None
        if text is None:
            return []
        stable, unstable = st.agreement.update(text)
        if (stable, unstable) == st.sent:
            return []
        st.sent = (stable, unstable)
        return [TranscriptPartial(self.next_turn_id, stable, unstable)]

    # ------------------------------------------------------------ internals

    def _overlap_long(self, received_ns: int, out: list[Action]) -> None:
        """Speech over the reply reached ``interrupt_ms``: interrupt, or (``interrupt_check_ms``)
        transcribe it first."""
        if self._overlap_check is not None:
            return  # its transcript is awaited
        if not self.turn.interrupt_check_ms:
            self._interrupt(out)
            return
        decode_id = next(self._ids)
        deadline = received_ns + self.turn.interrupt_check_ms * 1_000_000
        self._overlap_check = _OverlapCheck(decode_id, deadline)
        out.append(
            StartDecode(
                decode_id,
                DecodeKind.OVERLAP,
                self.audio.slice(self.utterance_start, self.audio.end),
            )
        )

    def _overlap_overdue(self, now_ns: int, out: list[Action]) -> None:
        check = self._overlap_check
        if check is not None and now_ns >= check.deadline_ns:
            self._interrupt(out)  # no transcript in time: treat it as an interruption

    def _interrupt(self, out: list[Action]) -> None:
        """The speech over the reply is more than a backchannel: a real interruption."""
        self._drop_overlap_check(out)
        self._overlap_voiced = None
        out.append(BargeIn(self.next_turn_id))

    def _drop_overlap_check(self, out: list[Action]) -> None:
        if self._overlap_check is not None:
            out.append(DropDecode(self._overlap_check.decode_id, DecodeKind.OVERLAP))
            self._overlap_check = None

    def _trim(self) -> None:
        if not self.endpointer.in_speech and self.detection is Detection.SERVER_VAD:
            # the pre-roll, and the voiced windows that may yet become speech (min_speech_ms)
            run = -(-max(self.vad.min_speech_ms, WINDOW_MS) // WINDOW_MS)
            keep = self.vad.speech_pad_ms * SAMPLE_RATE // 1000 + run * FRAME
            # before the windows scored so far, not the audio pushed: audio that came in a burst
            # is pushed ahead of its scores, and a speech start among it must still find its
            # whole pre-roll (else the utterance's lead-in, and so its transcript, would depend
            # on how the audio arrived)
            scored = min(self.audio.end, (self.endpointer.window + 1) * FRAME)
            self.audio.trim_before(scored - keep)
        else:
            self.audio.trim_before(self.audio.end - int(self.vad.max_utterance_s * SAMPLE_RATE))

    def _early_ms(self) -> int:
        """Trailing silence that starts the early decode (0: none). Semantic detection with the
        text cue needs its transcript by the pause, so it starts there at the latest."""
        if self.judges_text:
            return min(self.early_final_ms or self.turn.pause_ms, self.turn.pause_ms)
        return self.early_final_ms

    def _maybe_start_early(self, out: list[Action]) -> None:
        ep, early_ms = self.endpointer, self._early_ms()
        if (
            not early_ms
            or self._early is not None
            or not ep.in_speech
            or self.detection is not Detection.SERVER_VAD
            or not self.auto_respond
        ):
            return
        if ep.silence_ms < early_ms:
            return
        audio = self.audio.slice(self.utterance_start, (ep.window + 1) * FRAME)
        self._early = _Early(next(self._ids), ep.last_voiced, self.utterance_start)
        out.append(StartDecode(self._early.decode_id, DecodeKind.EARLY, audio))

    def _maybe_judge(self, out: list[Action], now_ns: int) -> bool:
        """Semantic detection: at ``turn.pause_ms`` of silence, judge the utterance once. True
        when the verdict (already in) ended the turn."""
        ep = self.endpointer
        st = self._judgement
        if st is not None and st.end_after_ms is not None and ep.in_speech:
            if ep.silence_ms < st.end_after_ms:
                return False
            out.extend(self._end_judged(now_ns))  # the pause outlasted the hazard's doubt
            return True
        if st is not None and st.verdict is None and ep.in_speech:
            if ep.silence_ms < self._decide_by_ms():
                return False
            out.extend(self._decide(now_ns, deadline=True))  # an opinion is late: without it
            return not ep.in_speech
        if not self.semantic or not ep.in_speech or st is not None:
            return False
        if ep.silence_ms < self.turn.pause_ms:
            return False
        early = self._early
        need_text = self.judges_text and early is not None
        st = self._judgement = _Judgement(next(self._ids), self.turn.model != "none", need_text)
        if early is not None and need_text and early.text is not None:
            st.text, st.ending = early.text, early.ending  # the early decode came before the pause
            if self.hazard and self.score_text and st.text.strip():
                st.need_score = True
                out.append(ScoreText(st.judge_id, st.text.strip(), bare(st.text)))
        if st.need_audio:
            audio = self.audio.slice(self.utterance_start, (ep.window + 1) * FRAME)
            out.append(JudgeTurn(st.judge_id, audio))
        out.extend(self._decide(now_ns))
        return not ep.in_speech  # a complete verdict reset the endpointer

    def _decide_by_ms(self) -> int:
        """The silence by which a judgement is decided, with whatever opinions are in."""
        turn = self.turn
        return min(max(turn.decide_by_ms, turn.pause_ms), turn.max_silence_ms)

    def _decide(self, now_ns: int, deadline: bool = False) -> list[Action]:
        """The verdict, once every opinion awaited is in, or at ``turn.decide_by_ms`` of silence
        (``deadline``) with those in. Complete: the turn ends now. After a verdict at the
        deadline each late opinion decides again, and can only bring the end nearer."""
        st = self._judgement
        if st is None:
            return []
        awaited = st.awaited()
        if awaited and not (deadline or st.late):
            return []
        first = st.verdict is None
        st.late = st.late or bool(awaited)
        if self.hazard:
            out = self._decide_hazard(st, now_ns)
        else:
            out = self._decide_semantic(st, now_ns)
        if first:
            return [TurnJudged(st.judge_id, st.verdict or Verdict.INCOMPLETE, awaited), *out]
        return out

    def _decide_semantic(self, st: _Judgement, now_ns: int) -> list[Action]:
        """Complete or not from the opinions in; complete ends the turn now."""
        text = st.text or ""
        if st.need_text and st.text is not None and continues(text):
            complete = False  # the words stop mid-phrase ("a table for"): wait for the rest
        elif st.prob is None:
            complete = True  # no audio opinion (none asked, failed, or late): the words decide
        else:
            complete = st.prob >= self.turn.threshold or text.rstrip().endswith("?")
        st.verdict = Verdict.COMPLETE if complete else Verdict.INCOMPLETE
        return self._end_judged(now_ns) if complete else []

    def _decide_hazard(self, st: _Judgement, now_ns: int) -> list[Action]:
        """The silence after which the turn ends, from every opinion in (the shortest yet, when
        opinions came after the deadline); now, if it is past."""
        cues = text_cues(st.text or "") if self.turn.text_cue else (False, False)
        evidence = Evidence(
            st.prob,
            st.text_prob,
            st.bare_prob,
            *cues,
            head=st.head_prob,
            ending=st.ending,
            pause=st.pause_prob,
        )
        turn, ep = self.turn, self.endpointer
        wait = end_after_ms(
            evidence, turn.pause_ms, turn.max_silence_ms, turn.patience, self.habit.scale
        )
        if st.end_after_ms is not None:
            wait = min(wait, st.end_after_ms)  # a late opinion only shortens what is left
        st.end_after_ms = wait
        now = ep.silence_ms >= wait
        st.verdict = Verdict.COMPLETE if now else Verdict.INCOMPLETE
        return self._end_judged(now_ns) if now else []

    def _end_judged(self, now_ns: int) -> list[Action]:
        """A judgement ends the turn at the window just scored."""
        ep = self.endpointer
        end = (ep.window + 1) * FRAME
        out: list[Action] = [SpeechStopped(self.next_turn_id, end * 1000 // SAMPLE_RATE)]
        ep.reset()
        self._end_turn(end, now_ns, out, heard_ns=self._heard_ns)
        return out

    def _maybe_partial(self, out: list[Action], asr_busy: Callable[[], bool]) -> None:
        interval, ep = self.partial_interval_ms, self.endpointer
        if not interval or not ep.in_speech:
            return
        step = max(interval // WINDOW_MS, 1)  # endpointer windows between partial decodes
        st = self._partials
        if st is None or st.utterance_start != self.utterance_start:
            # the first one after an interval of speech: at its start there is nothing to hear,
            # and an empty decode would hold the worker while the first words arrive
            st = self._partials = _Partials(
                LocalAgreement(), self.utterance_start, ep.window + step
            )
        if st.in_flight is not None or ep.window < st.next_window:
            return
        if asr_busy():
            return  # back off: finals and early decodes of any session go first
        st.in_flight = next(self._ids)
        st.next_window = ep.window + step
        audio = self.audio.slice(self.utterance_start, (ep.window + 1) * FRAME)
        out.append(StartDecode(st.in_flight, DecodeKind.PARTIAL, audio))

    def _drop_early(self, out: list[Action]) -> None:
        if self._early is not None:
            out.append(DropDecode(self._early.decode_id, DecodeKind.EARLY))
            self._early = None

    def _drop_partials(self, out: list[Action]) -> None:
        if self._partials is not None and self._partials.in_flight is not None:
            out.append(DropDecode(self._partials.in_flight, DecodeKind.PARTIAL))
        self._partials = None

    def _end_turn(
        self, end: int, endpoint_ns: int, out: list[Action], heard_ns: int | None = None
    ) -> None:
        self._drop_partials(out)
        self._judgement = None
        overlap, self._overlap_voiced = self._overlap_voiced is not None, None
        self._drop_overlap_check(out)  # the turn's own transcript screens it now
        early, self._early = self._early, None
        if early is not None and not (
            early.utterance_start == self.utterance_start
            and early.last_voiced == self.endpointer.last_voiced
        ):
            out.append(DropDecode(early.decode_id, DecodeKind.EARLY))
            early = None
        audio = self.audio.slice(self.utterance_start, end)
        self.audio.trim_before(end)
        self.utterance_start = self.audio.end
        if audio.size < FRAME:
            if early is not None:
                out.append(DropDecode(early.decode_id, DecodeKind.EARLY))
            return  # nothing to transcribe
        out.append(
            TurnEnded(
                self.new_turn_id(),
                audio,
                self.last_voice_ns or endpoint_ns,
                endpoint_ns,
                early.decode_id if early is not None else None,
                overlap,
                heard_ns,
                self.last_voice_lag_ns if self.last_voice_ns else self._lag_ns,
                self._lag_ns,
            )
        )
