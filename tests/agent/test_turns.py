"""Turn-taking on a fake clock with scripted VAD probabilities (no models, no sleeping): speech
start and endpoint, the early final decode and when it is stale, partials and their back-off,
push-to-talk commits, clearing, the forced endpoint of a too-long utterance."""

from __future__ import annotations

import dataclasses

import numpy as np

from voicert.agent.turns import (
    DecodeKind,
    Detection,
    DropDecode,
    StartDecode,
    TurnEnded,
    TurnTaking,
)
from voicert.config import VadConfig
from voicert.core.events import SpeechStarted, SpeechStopped
from voicert.core.events import TranscriptPartial as PartialTranscript
from voicert.speech.vad import FRAME

WINDOW_NS = 32_000_000  # one VAD window of audio
VOICE, SILENCE = 0.9, 0.05


class Script:
    """Feeds one window of audio and its probability at a time, on a clock that advances 32 ms a
    window; records every action with the window that produced it."""

    def __init__(self, turns: TurnTaking, busy: bool = False) -> None:
        self.turns = turns
        self.window = -1
        self.actions: list[tuple[int, object]] = []
        self.busy = busy

    def feed(self, prob: float, n: int = 1) -> list:
        out = []
        for _ in range(n):
            self.window += 1
            received = self.window * WINDOW_NS
            level = 0.3 if prob >= 0.5 else 0.0
            self.turns.push(np.full(FRAME, level, np.float32))
            acts = self.turns.on_windows(
                np.array([prob]), received, received + 1_000, lambda: self.busy
            )
            out += acts
            self.actions += [(self.window, a) for a in acts]
        return out

    def of(self, kind) -> list:
        return [(w, a) for w, a in self.actions if isinstance(a, kind)]


def taking(**kw) -> TurnTaking:
    vad = dataclasses.replace(VadConfig(), **kw.pop("vad", {}))
    return TurnTaking(vad, **kw)


def test_speech_then_silence_starts_and_ends_a_turn_with_its_audio():
    s = Script(taking(early_final_ms=0))
    s.feed(SILENCE, 10)
    s.feed(VOICE, 20)  # windows 10-29
    s.feed(SILENCE, 20)
    ((w_start, started),) = s.of(SpeechStarted)
    assert w_start == 12  # min_speech_ms 96: the third voiced window decides
    assert started.turn_id == 1 and started.audio_ms == 10 * 32  # where speech began
    ((w_stop, _stopped),) = s.of(SpeechStopped)
    assert w_stop == 29 + 13  # 400 ms of silence: 13 windows after the last voiced one
    ((w_end, ended),) = s.of(TurnEnded)
    assert w_end == w_stop and ended.turn_id == 1 and ended.early_decode is None
    # the utterance: 200 ms of pre-roll before the first voiced window, up to the endpoint
    assert ended.audio.size == (w_stop + 1) * FRAME - (10 * FRAME - 3200)
    assert ended.voice_end_ns == 29 * WINDOW_NS  # the audio holding the last voiced window
    assert ended.endpoint_ns == w_stop * WINDOW_NS + 1_000
    # the deciding window's audio arrived 1 us before the decision (the VAD's share of the wait)
    assert ended.heard_ns == w_stop * WINDOW_NS
    assert s.turns.next_turn_id == 2


def test_audio_pushed_ahead_of_its_scores_keeps_the_whole_pre_roll():
    """Audio that arrives in a burst is pushed before its windows are scored (in later calls):
    the utterance still starts 200 ms before its first voiced window, as when it came window by
    window, whatever the silence before it."""
    turns = taking(early_final_ms=0)
    probs = [SILENCE] * 10 + [VOICE] * 20 + [SILENCE] * 20
    for p in probs:  # the whole burst first
        turns.push(np.full(FRAME, 0.3 if p >= 0.5 else 0.0, np.float32))
    acts = []
    for p in probs:  # then the VAD's scores, a window a call
        acts += turns.on_windows(np.array([p]), 0, 1_000)
    (ended,) = [a for a in acts if isinstance(a, TurnEnded)]
    by_window = Script(taking(early_final_ms=0))
    for p in probs:
        by_window.feed(p)
    ((_, want),) = by_window.of(TurnEnded)
    assert ended.audio.size == want.audio.size == 43 * FRAME - (10 * FRAME - 3200)
    assert np.array_equal(ended.audio, want.audio)


def test_a_short_blip_is_not_speech():
    s = Script(taking())
    s.feed(SILENCE, 5)
    s.feed(VOICE, 2)  # 64 ms < min_speech_ms
    s.feed(SILENCE, 30)
    assert s.actions == []


def test_the_early_decode_starts_in_the_silence_and_the_endpoint_takes_it():
    s = Script(taking(early_final_ms=160))
    s.feed(VOICE, 20)
    s.feed(SILENCE, 20)
    ((w_early, early),) = s.of(StartDecode)
    assert early.kind is DecodeKind.EARLY and w_early == 19 + 5  # 160 ms: 5 silent windows
    assert early.audio.size == (w_early + 1) * FRAME  # the utterance so far
    ((_, ended),) = s.of(TurnEnded)
    assert ended.early_decode == early.decode_id and not s.of(DropDecode)
    assert not s.turns.early_is_current(early.decode_id)  # the turn took it


def test_talking_again_makes_the_early_decode_stale_and_a_new_one_is_made():
    s = Script(taking(early_final_ms=160))
    s.feed(VOICE, 20)
    s.feed(SILENCE, 7)  # the early decode starts...
    s.feed(VOICE, 5)  # ...and the speaker goes on: it no longer covers the utterance
    s.feed(SILENCE, 20)
    starts = [a for _, a in s.of(StartDecode)]
    ((_, dropped),) = s.of(DropDecode)
    assert len(starts) == 2 and dropped.decode_id == starts[0].decode_id
    ((_, ended),) = s.of(TurnEnded)
    assert ended.early_decode == starts[1].decode_id


def test_no_early_decode_without_server_vad_or_auto_respond():
    for kw in ({"detection": Detection.MANUAL}, {"auto_respond": False}):
        s = Script(taking(early_final_ms=160, **kw))
        s.feed(VOICE, 20)
        s.feed(SILENCE, 20)
        assert not s.of(StartDecode)


def test_partials_every_interval_one_at_a_time_and_not_while_the_asr_is_busy():
    s = Script(taking(partial_interval_ms=320))  # every 10 windows of speech
    s.feed(VOICE, 14)
    ((w1, first),) = s.of(StartDecode)
    # an interval (10 windows) after the first window past the speech start (window 2)
    assert first.kind is DecodeKind.PARTIAL and w1 == 3 + 10
    s.feed(VOICE, 14)
    assert len(s.of(StartDecode)) == 1  # the first is still in flight: no second one
    # nothing agreed yet: all unstable
    assert s.turns.partial_done(first.decode_id, "what is the") == [
        PartialTranscript(1, "", "what is the")
    ]
    s.busy = True
    s.feed(VOICE, 3)
    assert len(s.of(StartDecode)) == 1  # the ASR worker has other work: back off
    s.busy = False
    second = s.feed(VOICE, 1)[0]
    assert isinstance(second, StartDecode)
    (partial,) = s.turns.partial_done(second.decode_id, "what is the weather")
    assert partial == PartialTranscript(1, "what is the", "weather")
    s.feed(SILENCE, 20)
    assert s.of(TurnEnded)
    assert s.turns.partial_done(second.decode_id, "late") == []  # a stale result is ignored


def test_the_turn_end_drops_a_partial_in_flight():
    s = Script(taking(partial_interval_ms=320))
    s.feed(VOICE, 14)
    ((_, partial),) = s.of(StartDecode)
    s.feed(SILENCE, 20)
    ((_, dropped),) = s.of(DropDecode)
    assert dropped.decode_id == partial.decode_id and dropped.kind is DecodeKind.PARTIAL


def test_manual_mode_waits_for_the_commit_and_takes_all_the_audio():
    tt = taking(detection=Detection.MANUAL)
    s = Script(tt)
    s.feed(SILENCE, 5)
    s.feed(VOICE, 20)
    s.feed(SILENCE, 20)
    assert s.of(SpeechStopped) and not s.of(TurnEnded)  # told, but the client decides
    (ended,) = tt.commit(now_ns=123)
    assert isinstance(ended, TurnEnded) and ended.endpoint_ns == 123
    assert ended.heard_ns is None  # the client decided, not the VAD
    assert ended.audio.size == 45 * FRAME  # everything since the last turn
    assert tt.commit(now_ns=124) == []  # nothing new: no turn


def test_clear_forgets_the_audio_and_drops_decodes_in_flight():
    tt = taking(early_final_ms=160)
    s = Script(tt)
    s.feed(VOICE, 20)
    s.feed(SILENCE, 6)
    ((_, early),) = s.of(StartDecode)
    (dropped,) = tt.clear()
    assert dropped == DropDecode(early.decode_id, DecodeKind.EARLY)
    assert tt.commit(now_ns=1) == []  # nothing left to transcribe


def test_a_too_long_utterance_is_cut_at_max_utterance_s():
    s = Script(taking(vad={"max_utterance_s": 2.0}))
    s.feed(VOICE, 100)
    ((w, _),) = s.of(TurnEnded)
    assert w == 62  # 2 s = 62.5 windows from the first voiced one
