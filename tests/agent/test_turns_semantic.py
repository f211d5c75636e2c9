"""Semantic end of turn on a fake clock (no models, no sleeping): the judgement at a short pause,
its cues (the audio model's probability, the early transcript's last words), a complete utterance
ending at the pause, an incomplete one waiting for the rest up to the maximum silence, stale
judgements, and the silence detector unchanged. Speech over a reply: held as a possible
backchannel, or interrupting."""

from __future__ import annotations

import dataclasses

import numpy as np
from test_turns import SILENCE, VOICE, WINDOW_NS, Script

from voicert.agent.turns import (
    DecodeKind,
    DropDecode,
    JudgeTurn,
    StartDecode,
    TurnEnded,
    TurnJudged,
    TurnTaking,
    Verdict,
)
from voicert.config import TurnConfig, VadConfig
from voicert.core.events import BargeIn, SpeechStarted, SpeechStopped
from voicert.core.speech import Ending
from voicert.speech.vad import FRAME


def decided(out: list) -> list:
    """The actions after a verdict, the TurnJudged record (checked) left out."""
    assert sum(isinstance(a, TurnJudged) for a in out) == 1
    return [a for a in out if not isinstance(a, TurnJudged)]


def incomplete(out: list) -> bool:
    return [getattr(a, "verdict", None) for a in out] == [Verdict.INCOMPLETE]


def semantic(early_final_ms: int = 160, **turn) -> TurnTaking:
    cfg = dataclasses.replace(TurnConfig(detector="semantic"), **turn)
    return TurnTaking(VadConfig(), early_final_ms=early_final_ms, turn=cfg)


def speak(s: Script, voiced: int = 20) -> int:
    """Silence, then speech; returns the last voiced window."""
    s.feed(SILENCE, 5)
    s.feed(VOICE, voiced)
    return s.window


def test_a_complete_utterance_ends_at_the_pause_once_both_cues_are_in():
    s = Script(semantic())
    last = speak(s)
    s.feed(SILENCE, 6)  # 192 ms: the pause
    ((w_early, early),) = s.of(StartDecode)
    assert early.kind is DecodeKind.EARLY and w_early == last + 5  # 160 ms
    ((w_judge, judge),) = s.of(JudgeTurn)
    assert (
        w_judge == last + 6 and judge.audio.size == (w_judge + 1) * FRAME
    )  # from the start: the pre-roll reaches it
    assert s.of(TurnEnded) == []  # the transcript is not in yet
    assert s.turns.judged(judge.judge_id, 0.9, 10) == []  # nor the words
    now = (last + 8) * WINDOW_NS
    out = s.turns.early_done(early.decode_id, "What is the capital of France?", now)
    stopped, ended = decided(out)
    assert isinstance(stopped, SpeechStopped) and stopped.audio_ms == (w_judge + 1) * 32
    assert isinstance(ended, TurnEnded) and ended.early_decode == early.decode_id
    assert ended.endpoint_ns == now and ended.voice_end_ns == last * WINDOW_NS
    assert [a.verdict for a in out if isinstance(a, TurnJudged)] == [Verdict.COMPLETE]
    s.feed(SILENCE, 60)  # no second endpoint for the same utterance
    assert s.of(SpeechStopped) == [] and s.of(TurnEnded) == []


def test_words_that_stop_mid_phrase_hold_the_turn_until_the_speaker_goes_on():
    s = Script(semantic())
    speak(s)
    s.feed(SILENCE, 6)
    ((_, early),) = s.of(StartDecode)
    ((_, judge),) = s.of(JudgeTurn)
    assert s.turns.early_done(early.decode_id, "I would like to book a table for", 1) == []
    assert incomplete(
        s.turns.judged(judge.judge_id, 0.97, 2)
    )  # the audio model alone would cut here
    s.feed(SILENCE, 20)  # a 0.8 s pause in all: still the same turn
    assert s.of(TurnEnded) == []
    s.feed(VOICE, 15)  # "four people tonight"
    assert any(isinstance(a, DropDecode) and a.decode_id == early.decode_id for _, a in s.actions)
    last = s.window
    s.feed(SILENCE, 6)
    starts = [a for _, a in s.of(StartDecode)]
    judges = [a for _, a in s.of(JudgeTurn)]
    assert len(starts) == 2 and len(judges) == 2  # the new pause is judged afresh
    s.turns.judged(judges[1].judge_id, 0.8, 3)
    _stopped, ended = decided(
        s.turns.early_done(
            starts[1].decode_id,
            "I would like to book a table for four people tonight.",
            (last + 7) * WINDOW_NS,
        )
    )
    assert ended.early_decode == starts[1].decode_id
    # the whole utterance, both halves and the pause between them
    assert ended.audio.size == (last + 7) * FRAME


def test_an_utterance_judged_incomplete_ends_at_the_maximum_silence():
    s = Script(semantic(max_silence_ms=1600))
    last = speak(s)
    s.feed(SILENCE, 6)
    ((_, early),) = s.of(StartDecode)
    ((_, judge),) = s.of(JudgeTurn)
    s.turns.early_done(early.decode_id, "So what I was thinking is that", 1)
    s.turns.judged(judge.judge_id, 0.1, 2)
    s.feed(SILENCE, 60)
    ((w_stop, _),) = s.of(SpeechStopped)
    assert w_stop == last + 50  # 1600 ms / 32 ms
    ((_, ended),) = s.of(TurnEnded)
    assert ended.early_decode == early.decode_id  # the early decode still covers it


def test_the_audio_model_decides_when_the_words_could_end_there():
    s = Script(semantic())
    speak(s)
    s.feed(SILENCE, 6)
    ((_, early),) = s.of(StartDecode)
    ((_, judge),) = s.of(JudgeTurn)
    s.turns.early_done(early.decode_id, "Book a table for four people.", 1)
    assert incomplete(s.turns.judged(judge.judge_id, 0.2, 2))


def test_a_question_mark_in_the_transcript_outweighs_a_hesitant_audio_score():
    s = Script(semantic())
    speak(s)
    s.feed(SILENCE, 6)
    ((_, early),) = s.of(StartDecode)
    ((_, judge),) = s.of(JudgeTurn)
    s.turns.judged(judge.judge_id, 0.2, 1)
    out = s.turns.early_done(early.decode_id, "Can you tell me a short joke?", 2)
    assert isinstance(out[-1], TurnEnded)


def test_an_early_transcript_in_before_the_pause_is_used_at_once():
    s = Script(semantic(model="none"))
    speak(s)
    s.feed(SILENCE, 5)
    ((_, early),) = s.of(StartDecode)
    assert s.turns.early_done(early.decode_id, "Thank you, that is all.", 1) == []
    out = s.feed(SILENCE, 1)  # the pause: no audio model, the words are in: decided now
    assert s.of(JudgeTurn) == [] and isinstance(out[-1], TurnEnded)


def test_a_failed_audio_model_leaves_the_words_to_decide():
    s = Script(semantic())
    speak(s)
    s.feed(SILENCE, 6)
    ((_, early),) = s.of(StartDecode)
    ((_, judge),) = s.of(JudgeTurn)
    s.turns.early_done(early.decode_id, "What time is it.", 1)
    assert isinstance(s.turns.judged(judge.judge_id, None, 2)[-1], TurnEnded)


def test_speech_after_the_pause_makes_a_late_judgement_moot():
    s = Script(semantic())
    speak(s)
    s.feed(SILENCE, 6)
    ((_, early),) = s.of(StartDecode)
    ((_, judge),) = s.of(JudgeTurn)
    s.feed(VOICE, 3)
    assert s.turns.judged(judge.judge_id, 0.99, 1) == []
    assert s.turns.early_done(early.decode_id, "Hello.", 2) == []
    assert s.of(TurnEnded) == []


def test_without_the_text_cue_the_audio_model_alone_decides_and_no_early_decode_is_needed():
    s = Script(semantic(early_final_ms=0, text_cue=False))
    speak(s)
    s.feed(SILENCE, 6)
    assert s.of(StartDecode) == []
    ((_, judge),) = s.of(JudgeTurn)
    _stopped, ended = decided(s.turns.judged(judge.judge_id, 0.7, 5))
    assert ended.early_decode is None and ended.endpoint_ns == 5


def test_the_text_cue_starts_the_early_decode_by_the_pause_when_early_finals_are_off():
    s = Script(semantic(early_final_ms=0, pause_ms=256))
    last = speak(s)
    s.feed(SILENCE, 8)
    ((w, early),) = s.of(StartDecode)
    assert early.kind is DecodeKind.EARLY and w == last + 8


def test_the_silence_detector_is_todays_behaviour():
    s = Script(TurnTaking(VadConfig(), early_final_ms=160, turn=TurnConfig(detector="silence")))
    last = speak(s)
    s.feed(SILENCE, 30)
    assert s.of(JudgeTurn) == []
    ((w_stop, _),) = s.of(SpeechStopped)
    assert w_stop == last + 13  # vad.min_silence_ms 400


# ---------------------------------------------------------------- speech over a reply


def over_reply(s: Script, voiced: int) -> list:
    """Speech while a reply runs: ``voiced`` windows, then silence."""
    out = []
    for prob in [SILENCE] * 3 + [VOICE] * voiced + [SILENCE] * 20:
        s.window += 1
        received = s.window * WINDOW_NS
        s.turns.push(np.full(FRAME, 0.3 if prob >= 0.5 else 0.0, np.float32))
        acts = s.turns.on_windows(np.array([prob]), received, received + 1_000, replying=True)
        s.actions += [(s.window, a) for a in acts]
        out += acts
    return out


def test_short_speech_over_a_reply_does_not_interrupt_and_ends_as_an_overlap():
    s = Script(TurnTaking(VadConfig(), turn=TurnConfig(detector="silence")))
    out = over_reply(s, voiced=8)  # 256 ms: "mm-hm"
    assert not any(isinstance(a, BargeIn) for a in out)
    (ended,) = [a for a in out if isinstance(a, TurnEnded)]
    assert ended.overlap  # the session screens its transcript


def test_speech_over_a_reply_that_goes_on_interrupts_once_it_reaches_interrupt_ms():
    s = Script(TurnTaking(VadConfig(), turn=TurnConfig(detector="silence", interrupt_ms=480)))
    over_reply(s, voiced=30)
    ((w_barge, barge),) = s.of(BargeIn)
    ((_w_start, started),) = s.of(SpeechStarted)
    assert w_barge == 3 + 15 - 1 and barge.turn_id == started.turn_id  # the 15th voiced window
    ((_, ended),) = s.of(TurnEnded)
    assert not ended.overlap  # it already interrupted: an ordinary turn


def test_without_backchannels_or_a_reply_speech_interrupts_at_once():
    for turns, replying in (
        (TurnConfig(detector="silence", backchannels=False), True),
        (TurnConfig(detector="silence"), False),
    ):
        s = Script(TurnTaking(VadConfig(), turn=turns))
        s.feed(SILENCE, 3)
        for _ in range(8):
            s.window += 1
            s.turns.push(np.full(FRAME, 0.3, np.float32))
            s.actions += [
                (s.window, a)
                for a in s.turns.on_windows(
                    np.array([VOICE]), s.window * WINDOW_NS, 0, replying=replying
                )
            ]
        kinds = [type(a).__name__ for _, a in s.actions]
        assert kinds == ["SpeechStarted", "BargeIn"]


class Overlap:
    """Speech over a running reply, one window at a time, with ``turn.interrupt_check_ms``:
    ``transcript`` answers the overlap decode ``answer_after`` windows after it starts (None:
    never)."""

    def __init__(self, check_ms: int = 160, interrupt_ms: int = 480) -> None:
        turn = TurnConfig(
            detector="silence", interrupt_ms=interrupt_ms, interrupt_check_ms=check_ms
        )
        self.s = Script(TurnTaking(VadConfig(), turn=turn))
        self.decodes: list[tuple[int, StartDecode]] = []

    def run(self, voiced: int, transcripts: list[str | None], answer_after: int = 2) -> list:
        pending: list[tuple[int, int, str | None]] = []  # (window due, decode id, text)
        for prob in [SILENCE] * 3 + [VOICE] * voiced + [SILENCE] * 20:
            s = self.s
            s.window += 1
            for _due, decode_id, text in [p for p in pending if p[0] == s.window]:
                s.actions += [(s.window, a) for a in s.turns.overlap_done(decode_id, text)]
            received = s.window * WINDOW_NS
            s.turns.push(np.full(FRAME, 0.3 if prob >= 0.5 else 0.0, np.float32))
            acts = s.turns.on_windows(np.array([prob]), received, received + 1_000, replying=True)
            s.actions += [(s.window, a) for a in acts]
            for a in acts:
                if isinstance(a, StartDecode) and a.kind is DecodeKind.OVERLAP:
                    self.decodes.append((s.window, a))
                    text = transcripts.pop(0) if transcripts else None
                    if text is not None:
                        pending.append((s.window + answer_after, a.decode_id, text))
        return [a for _, a in self.s.actions]


def test_a_checked_backchannel_that_reaches_interrupt_ms_lets_the_reply_go_on():
    o = Overlap()
    out = o.run(voiced=22, transcripts=["Mm-hmm."])  # a slow "mm-hmmm": 704 ms of voice
    ((w, start),) = o.decodes  # transcribed at the 15th voiced window (480 ms)
    assert w == 3 + 15 - 1 and start.audio.size >= 15 * FRAME
    assert not any(isinstance(a, BargeIn) for a in out)
    (ended,) = [a for a in out if isinstance(a, TurnEnded)]
    assert ended.overlap  # the whole utterance is screened again by its own transcript


def test_checked_words_that_are_no_backchannel_interrupt_when_their_transcript_comes():
    o = Overlap()
    o.run(voiced=30, transcripts=["Hold on, what did"], answer_after=3)
    ((w_check, _),) = o.decodes
    ((w_barge, _),) = o.s.of(BargeIn)
    assert w_barge == w_check + 3  # the transcript's arrival, within the 160 ms allowed
    ((_, ended),) = o.s.of(TurnEnded)
    assert not ended.overlap


def test_no_transcript_in_time_interrupts_and_withdraws_the_decode():
    o = Overlap(check_ms=160)
    o.run(voiced=30, transcripts=[None])
    ((w_check, start),) = o.decodes
    ((w_barge, _),) = o.s.of(BargeIn)
    assert w_barge == w_check + 5  # 160 ms later: 5 windows of 32 ms
    dropped = [a for _, a in o.s.of(DropDecode) if a.kind is DecodeKind.OVERLAP]
    assert [d.decode_id for d in dropped] == [start.decode_id]
    assert o.s.turns.overlap_done(start.decode_id, "Mm-hm.") == []  # too late: ignored


def test_a_long_run_of_backchannels_is_checked_again_after_each_interrupt_ms():
    o = Overlap()
    out = o.run(voiced=40, transcripts=["Mm-hm.", "Yeah, okay."])
    # answered at the start of window 19; from it, 15 more voiced windows
    assert [w for w, _ in o.decodes] == [3 + 15 - 1, 3 + 15 - 1 + 2 + 15 - 1]
    assert not any(isinstance(a, BargeIn) for a in out)


def test_without_the_check_speech_reaching_interrupt_ms_interrupts_as_before():
    o = Overlap(check_ms=0)
    o.run(voiced=30, transcripts=[])
    assert o.decodes == [] and [w for w, _ in o.s.of(BargeIn)] == [3 + 15 - 1]


# ---------------------------------------------------------------- the hazard


def hazardous(score_text: bool = True, **turn) -> TurnTaking:
    """The hazard with the audio model's opinion (``model="none"``: without it, as the default)."""
    turn.setdefault("model", "smart_turn")
    cfg = dataclasses.replace(TurnConfig(detector="hazard"), **turn)
    return TurnTaking(VadConfig(), early_final_ms=160, turn=cfg, score_text=score_text)


def judged_pause(
    s: Script,
    text: str,
    audio: float,
    probs: tuple,
    ending: Ending | None = None,
    pause: float | None = None,
) -> list:
    """Speech, the 192 ms pause, and every opinion in: the actions of the last one. ``probs``:
    the LLM's (as written, bare[, head]); ``ending``: the recogniser's, with its transcript;
    ``pause``: the audio model's pause head's."""
    from voicert.agent.turns import ScoreText

    speak(s)
    s.feed(SILENCE, 6)
    ((_, early),) = s.of(StartDecode)
    ((_, judge),) = s.of(JudgeTurn)
    assert s.turns.judged(judge.judge_id, audio, 1, pause) == []
    out = s.turns.early_done(early.decode_id, text, 2, ending)
    (score,) = [a for a in out if isinstance(a, ScoreText)]
    assert (score.text, score.bare) == (text, text.rstrip(".?"))
    return s.turns.text_scored(score.judge_id, *probs[:2], 3, *probs[2:])


def test_hazard_a_pause_the_opinions_call_complete_ends_the_turn_at_once():
    s = Script(hazardous())
    sure = Ending(stop=0.95, comma=0.01)  # Whisper heard the question end
    out = judged_pause(s, "What is the capital of France?", 0.9, (0.8, 0.1), sure)
    assert [a.verdict for a in out if isinstance(a, TurnJudged)] == [Verdict.COMPLETE]
    assert [type(a) for a in out[1:]] == [SpeechStopped, TurnEnded]
    # the turn ends at the last window scored: decide_ms counts from that audio's arrival
    assert out[-1].heard_ns == s.window * WINDOW_NS and out[-1].endpoint_ns == 3


def test_hazard_without_the_audio_model_asks_for_no_judgement_and_decides_on_the_words():
    from voicert.agent.turns import ScoreText

    assert TurnConfig(detector="hazard").model == "smart_turn"  # "auto": for its pause head
    assert TurnConfig(detector="hazard", audio_head="none").model == "none"
    s = Script(hazardous(model="none"))
    speak(s)
    s.feed(SILENCE, 6)
    ((_, early),) = s.of(StartDecode)
    assert s.of(JudgeTurn) == []
    text = "What is the capital of France?"
    out = s.turns.early_done(early.decode_id, text, 2, Ending(stop=0.95, comma=0.01))
    (score,) = [a for a in out if isinstance(a, ScoreText)]
    out = s.turns.text_scored(score.judge_id, 0.8, 0.1, 3)
    assert [a.verdict for a in out if isinstance(a, TurnJudged)] == [Verdict.COMPLETE]


def test_hazard_weighs_the_pause_heads_opinion_as_the_hazard_says():
    from voicert.agent.hazard import Evidence, end_after_ms

    waits = []
    for pause in (0.02, 0.98):  # the pause head hears a speaker who will go on / who is done
        s = Script(hazardous(max_silence_ms=3000))
        probs = (0.001, 1e-6)
        assert incomplete(judged_pause(s, "I need eggs.", 0.5, probs, pause=pause))
        wait = end_after_ms(Evidence(0.5, *probs, pause=pause), 192, 3000, 2.0)
        last = s.window - 6
        s.feed(SILENCE, 100)
        ((w_stop, _),) = s.of(SpeechStopped)
        assert w_stop == last + -(-int(wait) // 32)
        waits.append(wait)
    assert waits[0] > waits[1]  # "will go on" waits longer


def test_hazard_doubt_waits_for_a_longer_pause_not_for_the_maximum():
    from voicert.agent.hazard import Evidence, end_after_ms

    s = Script(hazardous(max_silence_ms=1600))
    probs = (0.001, 1e-6)
    out = judged_pause(s, "I need eggs.", 0.5, probs)
    assert incomplete(out)
    last = s.window - 6
    wait = end_after_ms(Evidence(0.5, *probs), 192, 1600, bias=s.turns.turn.patience)
    assert 192 < wait < 1600
    s.feed(SILENCE, 60)
    ((w_stop, _),) = s.of(SpeechStopped)
    assert w_stop == last + -(-int(wait) // 32)  # the first window at or past the wait
    ((_, ended),) = s.of(TurnEnded)
    assert ended.heard_ns == w_stop * WINDOW_NS and ended.endpoint_ns == w_stop * WINDOW_NS + 1_000


def test_hazard_speech_in_the_wait_keeps_the_turn_and_teaches_the_callers_habit():
    s = Script(hazardous())
    judged_pause(s, "I need eggs.", 0.5, (0.001, 1e-6))  # waits ~560 ms
    s.feed(SILENCE, 4)  # 320 ms in all: still waiting
    s.feed(VOICE, 10)  # "milk"
    assert s.of(TurnEnded) == []
    assert s.turns.habit.mean_ms == 320  # the pause they went on after (10 windows)


def test_hazard_without_a_scoring_engine_judges_on_the_audio_alone():
    from voicert.agent.turns import ScoreText

    s = Script(hazardous(score_text=False))
    speak(s)
    s.feed(SILENCE, 6)
    ((_, early),) = s.of(StartDecode)
    ((_, judge),) = s.of(JudgeTurn)
    out = s.turns.early_done(early.decode_id, "Hello there.", 1)
    assert not [a for a in out if isinstance(a, ScoreText)]
    out = s.turns.judged(judge.judge_id, 0.99, 2)
    assert [a for a in out if isinstance(a, TurnJudged)]


def test_hazard_a_failed_score_counts_as_no_opinion():
    s = Script(hazardous())
    out = judged_pause(s, "Yes please.", 0.6, (None, None))
    assert [a for a in out if isinstance(a, TurnJudged)]  # decided without the text


def test_hazard_a_transcript_that_stops_on_a_preposition_waits_longer():
    waits = []
    for text in ("I need a table for four.", "I need a table for"):
        s = Script(hazardous())
        judged_pause(s, text, 0.6, (0.05, 1e-4))
        s.feed(SILENCE, 80)
        ((w_stop, _),) = s.of(SpeechStopped)
        waits.append(w_stop)
    assert waits[1] - waits[0] >= 15  # ~500 ms (2 log-odds at 4 a second) more, in 32 ms windows


def test_hazard_the_recognisers_pause_mark_after_the_last_word_waits_longer_than_its_full_stop():
    """ "I need eggs." with the same scores: Whisper wavering towards "," (the voice went on
    rising) holds the turn longer than a sure "." does, with the head's opinion and without."""
    for probs in ((0.01, 1e-4), (0.01, 1e-4, 0.3)):
        waits = []
        for ending in (Ending(stop=0.95, comma=0.01), Ending(stop=0.3, comma=0.6), None):
            s = Script(hazardous())
            judged_pause(s, "I need eggs.", 0.5, probs, ending)
            s.feed(SILENCE, 80)
            ((w_stop, _),) = s.of(SpeechStopped)
            waits.append(w_stop)
        sure, wavering, unsaid = waits
        assert sure < unsaid < wavering, probs


# ---------------------------------------------------------------- a deadline on the opinions


def pause_with(s: Script, *, audio: float | None, text: str | None) -> tuple:
    """Speech and the 192 ms pause; the audio model's opinion and the early transcript given
    where not None (None: late). Returns (last voiced window, early decode, judge, actions)."""
    last = speak(s)
    s.feed(SILENCE, 6)
    ((_, early),) = s.of(StartDecode)
    ((_, judge),) = s.of(JudgeTurn)
    out: list = []
    if audio is not None:
        out += s.turns.judged(judge.judge_id, audio, 1, None)
    if text is not None:
        out += s.turns.early_done(early.decode_id, text, 2, Ending(stop=0.9, comma=0.05))
    return last, early, judge, out


def test_hazard_a_score_that_never_comes_is_decided_without_at_the_deadline():
    from voicert.agent.hazard import Evidence, end_after_ms, text_cues

    s = Script(hazardous())
    text = "What is the capital of France?"
    last, _, _, out = pause_with(s, audio=0.6, text=text)
    assert [a for a in out if isinstance(a, TurnJudged)] == []  # the score is awaited
    s.feed(SILENCE, 80)  # it never comes
    ((w_judged, judged),) = s.of(TurnJudged)
    assert w_judged == last + 19 and judged.late == ("score",)  # 608 ms: decide_by_ms 600
    without = end_after_ms(
        Evidence(
            0.6,
            ending=Ending(stop=0.9, comma=0.05),
            **dict(zip(("dangling", "question"), text_cues(text))),
        ),
        192,
        1600,
        2.0,
    )
    ((w_stop, _),) = s.of(SpeechStopped)
    assert w_stop == last + max(19, -(-int(without) // 32))  # never the 1.6 s maximum
    assert (w_stop - last) * 32 < 1600


def test_hazard_a_late_score_that_calls_it_over_ends_the_turn_when_it_comes():
    from voicert.agent.turns import ScoreText

    s = Script(hazardous(max_silence_ms=3000, patience=6.0))  # wary: the opinions decide
    _, _, _, out = pause_with(s, audio=0.5, text="I need eggs.")
    (score,) = [a for a in out if isinstance(a, ScoreText)]
    s.feed(SILENCE, 20)  # past the deadline: decided without the score, still waiting
    assert s.of(SpeechStopped) == []
    assert [j.verdict for _, j in s.of(TurnJudged)] == [Verdict.INCOMPLETE]
    out = s.turns.text_scored(score.judge_id, 0.999999, 0.999999, 7, 0.999999)
    assert [type(a) for a in out] == [SpeechStopped, TurnEnded]  # the late one shortened it
    assert out[-1].endpoint_ns == 7 and len(s.of(TurnJudged)) == 1


def test_hazard_a_late_score_that_doubts_never_lengthens_the_wait():
    from voicert.agent.turns import ScoreText

    waits = []
    for late_score in (None, (1e-6, 1e-6)):
        s = Script(hazardous())
        last, _, _, out = pause_with(s, audio=0.6, text="What is the capital of France?")
        (score,) = [a for a in out if isinstance(a, ScoreText)]
        s.feed(SILENCE, 20)
        if late_score is not None:
            assert s.turns.text_scored(score.judge_id, *late_score, 8) == []
        s.feed(SILENCE, 60)
        ((w_stop, _),) = s.of(SpeechStopped)
        waits.append(w_stop - last)
    assert waits[1] == waits[0]


def test_hazard_a_late_transcript_is_asked_its_score_and_may_end_the_turn_early():
    from voicert.agent.turns import ScoreText

    s = Script(hazardous(max_silence_ms=3000, patience=4.0))
    _, early, _, _ = pause_with(s, audio=0.5, text=None)
    s.feed(SILENCE, 14)  # 20 windows of silence: decided on the audio alone
    ((_, judged),) = s.of(TurnJudged)
    assert judged.late == ("text",) and s.of(SpeechStopped) == []
    out = s.turns.early_done(early.decode_id, "Thank you.", 9)
    (score,) = [a for a in out if isinstance(a, ScoreText)]  # the late words are still scored
    assert s.of(SpeechStopped) == [] and SpeechStopped not in map(type, out)
    out = s.turns.text_scored(score.judge_id, 0.999999, 0.999999, 10, 0.999999)
    assert [type(a) for a in out] == [SpeechStopped, TurnEnded]


def test_semantic_a_late_audio_model_leaves_the_words_to_decide_at_the_deadline():
    s = Script(semantic())
    last, _, judge, out = pause_with(s, audio=None, text="Book me a table.")
    assert out == []  # the audio model's opinion is awaited
    s.feed(SILENCE, 30)
    ((w_judged, judged),) = s.of(TurnJudged)
    assert judged.late == ("audio",) and judged.verdict is Verdict.COMPLETE
    ((w_stop, _),) = s.of(SpeechStopped)
    assert w_judged == w_stop == last + 19
    assert s.turns.judged(judge.judge_id, 0.1, 11) == []  # too late to matter: the turn is over


def test_semantic_words_that_dangle_wait_at_the_deadline_and_a_late_complete_ends_it():
    s = Script(semantic())
    last, _, judge, _ = pause_with(s, audio=None, text="Book me a table for")
    s.feed(SILENCE, 20)
    assert [j.verdict for _, j in s.of(TurnJudged)] == [Verdict.INCOMPLETE]
    assert s.of(SpeechStopped) == []
    out = s.turns.judged(judge.judge_id, 0.2, 12)  # the audio model agrees: not over
    assert out == []
    s.feed(SILENCE, 40)
    ((w_stop, _),) = s.of(SpeechStopped)
    assert w_stop == last + 50  # the maximum silence, as before: the words said unfinished


def test_the_deadline_is_held_between_the_pause_and_the_maximum_silence():
    from voicert.config import ConfigError

    assert semantic(decide_by_ms=64)._decide_by_ms() == 192
    assert semantic(decide_by_ms=5000)._decide_by_ms() == 1600
    try:
        TurnConfig(decide_by_ms=10)
    except ConfigError as exc:
        assert "turn.decide_by_ms" in str(exc)
    else:
        raise AssertionError("accepted")
