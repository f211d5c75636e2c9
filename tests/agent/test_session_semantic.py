"""Semantic end of turn through the session, with fake services (no models, no sleeping): a pause
after an incomplete phrase does not end the turn, a complete utterance ends at the short pause
with the early decode's transcript, a failing model leaves the words to decide."""

from __future__ import annotations

import asyncio
import dataclasses
import logging

import numpy as np

from tests.agent.fakes import EnergyVad, FakeAsr, FakeEngine, FakeJudge
from tests.agent.test_session_logic import until
from voicert.agent.session import Services, Session
from voicert.audio.pcm import encode_pcm16
from voicert.config import Config, TurnConfig
from voicert.core import events as ev
from voicert.core.speech import FINAL
from voicert.protocol import native as p


def make(asr, judge, **turn):
    cfg = dataclasses.replace(
        Config(), turn=dataclasses.replace(TurnConfig(detector="semantic"), **turn)
    )
    svc = Services(cfg=cfg, vad=EnergyVad(), asr=asr, engine=FakeEngine(), turn_judge=judge)
    events: list = []

    async def emit(event):
        events.append(event)

    return Session("s1", p.SessionStart(), svc, emit), events


def over_a_reply(
    turn: TurnConfig,
    asr: FakeAsr,
    engine: FakeEngine,
    tts=None,
    start: p.SessionStart | None = None,
) -> tuple[Session, Services, list]:
    """A session whose replies can be talked over: its services and the events it emits."""
    svc = Services(
        cfg=dataclasses.replace(Config(), turn=turn),
        vad=EnergyVad(),
        asr=asr,
        engine=engine,
        tts=tts,
    )
    events: list = []

    async def emit(event):
        events.append(event)

    return Session("s1", start or p.SessionStart(), svc, emit), svc, events


def audio(*parts: tuple[str, float]) -> np.ndarray:
    """('voice' | 'silence', seconds) pieces."""
    out = []
    for kind, seconds in parts:
        n = int(16000 * seconds)
        out.append(0.3 * np.sin(np.arange(n) * 0.05) if kind == "voice" else np.zeros(n))
    return np.concatenate(out).astype(np.float32)


async def send(session, x: np.ndarray) -> None:
    for i in range(0, x.size, 320):
        await session.on_audio(encode_pcm16(x[i : i + 320]))


def finals(events):
    return [e.text for e in events if isinstance(e, ev.TranscriptFinal)]


async def test_a_pause_after_an_incomplete_phrase_keeps_the_turn_open():
    asr = FakeAsr(auto=False)
    session, events = make(asr, FakeJudge(0.95))
    await send(session, audio(("voice", 1.0), ("silence", 0.3)))
    early = asr.decodes[-1]
    asr.answer(early, "I would like to book a table for")
    metrics = session.svc.metrics.registry
    await until(
        lambda: (
            metrics.get_sample_value("voicert_turn_verdicts_total", {"verdict": "incomplete"}) == 1
        )
    )
    await send(session, audio(("silence", 0.5), ("voice", 0.8), ("silence", 0.3)))
    assert finals(events) == [] and early.future.done()
    asr.answer(asr.decodes[-1], "I would like to book a table for four people tonight.")
    await until(lambda: finals(events))
    assert finals(events) == ["I would like to book a table for four people tonight."]
    assert await session.wait_turn(10)
    stopped = [e for e in events if isinstance(e, ev.SpeechStopped)]
    assert len(stopped) == 1
    for verdict in ("incomplete", "complete"):  # each judgement counted for /metrics
        assert metrics.get_sample_value("voicert_turn_verdicts_total", {"verdict": verdict}) == 1


async def test_a_complete_utterance_ends_at_the_short_pause():
    asr, judge = FakeAsr(auto=False), FakeJudge(0.9)
    session, events = make(asr, judge)
    await send(session, audio(("voice", 1.0), ("silence", 0.25)))  # 250 ms: under today's 400
    asr.answer(asr.decodes[-1], "What is the capital of France?")
    await until(lambda: finals(events))
    assert len(judge.calls) == 1 and len(asr.decodes) == 1  # the early decode is the final one
    assert asr.decodes[0].priority == FINAL  # the verdict waits for it: no queueing behind finals
    assert await session.wait_turn(10)
    assert any(isinstance(e, ev.ReplyDone) for e in events)


async def test_a_failing_model_leaves_the_decision_to_the_words():
    asr = FakeAsr(auto=False)
    session, events = make(asr, FakeJudge(fail=True))
    await send(session, audio(("voice", 1.0), ("silence", 0.25)))
    asr.answer(asr.decodes[-1], "Thank you, that is all.")
    await until(lambda: finals(events))
    assert await session.wait_turn(10)


async def test_a_judge_whose_host_went_away_is_one_warning_line_and_the_words_decide(caplog):
    from voicert.core.speech import SpeechUnavailable

    asr = FakeAsr(auto=False)
    session, events = make(asr, FakeJudge(error=SpeechUnavailable("speech host went away")))
    with caplog.at_level(logging.WARNING, logger="voicert.agent.session"):
        await send(session, audio(("voice", 1.0), ("silence", 0.25)))
        asr.answer(asr.decodes[-1], "Thank you, that is all.")
        await until(lambda: finals(events))
    said = [r for r in caplog.records if r.name == "voicert.agent.session"]
    assert [r.getMessage().split(": ", 1)[1] for r in said] == [
        "no turn-completion judgement: speech host went away"
    ]
    assert all(r.exc_info is None for r in said)  # no traceback


async def test_a_backchannel_over_a_reply_lets_it_go_on_and_a_real_interjection_stops_it():
    engine = FakeEngine(reply="one two three four five six seven eight", gated=True)
    asr = FakeAsr("what is the capital of france")
    session, svc, events = over_a_reply(TurnConfig(detector="silence"), asr, engine)
    await send(session, audio(("voice", 1.0), ("silence", 0.6)))
    await until(lambda: engine.requests)
    first = engine.requests[0].request_id
    engine.release(first)
    asr.text = "Mm-hm."
    await send(session, audio(("voice", 0.25), ("silence", 0.6)))  # under turn.interrupt_ms
    await until(
        lambda: (
            svc.metrics.registry.get_sample_value(
                "voicert_speech_over_reply_total", {"outcome": "backchannel"}
            )
            == 1
        )
    )
    assert session._replying() and first not in engine.cancelled
    assert [e.text for e in events if isinstance(e, ev.TranscriptFinal)] == [
        "what is the capital of france"
    ]  # the backchannel is not a turn
    asr.text = "Wait."
    await send(session, audio(("voice", 0.25), ("silence", 0.6)))
    await until(lambda: first in engine.cancelled)
    await until(lambda: len(engine.requests) == 2)  # the interjection is answered
    engine.gated = False
    engine.release()
    await until(lambda: len([e for e in events if isinstance(e, ev.ReplyDone)]) == 2)
    done = [e for e in events if isinstance(e, ev.ReplyDone)]
    assert done[0].finish_reason == "interrupted"
    assert [e.text for e in events if isinstance(e, ev.TranscriptFinal)][-1] == "Wait."
    barge = [e for e in events if isinstance(e, ev.BargeIn)]
    assert len(barge) == 2  # the first utterance (nothing playing) and the interjection


async def test_a_checked_long_backchannel_lets_the_reply_go_on_and_long_words_stop_it():
    # turn.interrupt_check_ms: speech over the reply that reaches interrupt_ms (640 ms) is
    # transcribed first. The fake ASR answers at once; each frame lets the loop run, so the
    # transcript is in long before the (2 s) check would give up, however slow the machine.
    engine = FakeEngine(reply="one two three four five six seven eight", gated=True)
    asr = FakeAsr("what is the capital of france")
    session, svc, events = over_a_reply(
        TurnConfig(detector="silence", interrupt_check_ms=2000), asr, engine
    )

    async def send_paced(x: np.ndarray) -> None:
        for i in range(0, x.size, 320):
            await session.on_audio(encode_pcm16(x[i : i + 320]))
            await asyncio.sleep(0)

    await send(session, audio(("voice", 1.0), ("silence", 0.6)))
    await until(lambda: engine.requests)
    first = engine.requests[0].request_id
    engine.release(first)
    asr.text = "Mm-hmm."
    await send_paced(audio(("voice", 1.0), ("silence", 0.6)))  # past interrupt_ms
    await until(
        lambda: (
            svc.metrics.registry.get_sample_value(
                "voicert_speech_over_reply_total", {"outcome": "backchannel"}
            )
            == 1
        )
    )
    checks = [d for d in asr.decodes if d.audio.size < 16000]  # the one at 640 ms of speech
    assert len(checks) == 1 and checks[0].priority == FINAL
    assert session._replying() and first not in engine.cancelled
    asr.text = "Hold on, what did you say?"
    await send_paced(audio(("voice", 1.0), ("silence", 0.6)))
    await until(lambda: first in engine.cancelled)
    await until(lambda: sum(isinstance(e, ev.ReplyStarted) for e in events) == 2)  # answered
    assert finals(events) == ["what is the capital of france", "Hold on, what did you say?"]
    checks = [d for d in asr.decodes if d.audio.size < 16000]
    assert len(checks) == 2  # the interjection, too, was transcribed at 640 ms


async def test_a_backchannel_while_a_reply_all_sent_still_plays_lets_the_audio_play_on():
    # A fast engine and voice send the whole spoken reply long before the caller has heard it.
    # The client plays it in real time: 10 words of 2 s each, made at once, play for 20 s after
    # they were sent (however slow this machine), and a "mm-hm" in that time is a backchannel,
    # not a new turn that stops the audio.
    from voicert.speech.tts import PluginVoice, TtsWorker

    class InstantVoice:  # 2 s of quiet tone per word, in one chunk, no waiting
        sample_rate = 16000

        def synthesize(self, text, on_chunk):
            for _ in text.split():
                if not on_chunk(np.full(32000, 0.01, np.float32)):
                    return

    engine = FakeEngine(reply=" ".join(["word"] * 10))
    asr = FakeAsr("tell me a story")
    tts = TtsWorker(PluginVoice(InstantVoice(), "instant"))
    try:
        session, svc, events = over_a_reply(
            TurnConfig(detector="silence"),
            asr,
            engine,
            tts,
            p.SessionStart(output_audio=p.OutputAudio("pcm16", 16000)),
        )
        await send(session, audio(("voice", 1.0), ("silence", 0.6)))
        await until(lambda: any(isinstance(e, ev.ReplyDone) for e in events), limit=10**7)
        assert await session.wait_turn(10)
        assert not session._replying() and session._agent_speaking()  # sent, still playing
        asr.text = "Mm-hm."
        await send(session, audio(("voice", 0.25), ("silence", 0.6)))
        await until(
            lambda: (
                svc.metrics.registry.get_sample_value(
                    "voicert_speech_over_reply_total", {"outcome": "backchannel"}
                )
                == 1
            )
        )
        assert sum(isinstance(e, ev.BargeIn) for e in events) == 1  # the question's own only
        assert finals(events) == ["tell me a story"]  # "mm-hm" is not a turn
    finally:
        tts.close()


def with_hazard(engine: FakeEngine, judge: FakeJudge):
    turn = TurnConfig(detector="hazard", model="smart_turn")
    svc = Services(
        cfg=dataclasses.replace(Config(), turn=turn),
        vad=EnergyVad(),
        asr=(asr := FakeAsr(auto=False)),
        engine=engine,
        turn_judge=judge,
    )
    events: list = []

    async def emit(event):
        events.append(event)

    return Session("s1", p.SessionStart(), svc, emit), asr, events


async def judged_incomplete(session) -> None:
    """Until the session's turn-taking has judged a pause incomplete (the turn goes on)."""
    registry = session.svc.metrics.registry
    await until(
        lambda: registry.get_sample_value("voicert_turn_verdicts_total", {"verdict": "incomplete"})
    )


async def test_hazard_the_llm_scores_the_early_transcript_and_a_sure_turn_ends_at_the_pause():
    text = "What is the capital of France?"
    engine = FakeEngine(end_probs={text: 0.9, text.rstrip("?"): 0.2})
    session, asr, events = with_hazard(engine, FakeJudge(0.9))
    await send(session, audio(("voice", 1.0), ("silence", 0.25)))  # under today's 400 ms
    asr.answer(asr.decodes[-1], text)
    await until(lambda: finals(events))
    scored = [r for r in engine.requests if r.score_end]
    assert sorted(r.messages[-1].content for r in scored) == sorted([text, text.rstrip("?")])
    assert all(r.messages[0].role == "system" for r in scored)  # the conversation's own prefix
    assert await session.wait_turn(10)
    registry = session.svc.metrics.registry
    assert registry.get_sample_value("voicert_turn_text_score_seconds_count") == 1


async def test_hazard_the_reply_starts_with_the_scores_and_the_turn_takes_it():
    """The reply is asked right after the end-of-turn scores of the early transcript, in the
    same callback (so one prefill step takes both), and it is the reply the turn sends: no
    second request."""
    text = "What is the capital of France?"
    engine = FakeEngine(end_probs={text: 0.9, text.rstrip("?"): 0.2})
    session, asr, events = with_hazard(engine, FakeJudge(0.9))
    await send(session, audio(("voice", 1.0), ("silence", 0.25)))
    asr.answer(asr.decodes[-1], text)
    assert await session.wait_turn(10)
    await until(lambda: any(isinstance(e, ev.ReplyDone) for e in events))
    # the transcript's score, then the reply; the bare transcript's score once the first is in
    assert [r.score_end for r in engine.requests] == [True, False, True]
    (reply,) = [r for r in engine.requests if not r.score_end]
    assert reply.messages[-1].content == text and reply.request_id not in engine.cancelled
    done = next(e for e in events if isinstance(e, ev.ReplyDone))
    assert done.text == engine.reply


async def test_hazard_a_score_asked_for_is_cancelled_when_the_session_ends_before_reading_it():
    """The score is submitted in the callback that spawns its reader (so the reply shares its
    prefill step); a session closed before that reader ran still withdraws it from the engine."""
    from voicert.agent.turns import ScoreText

    engine = FakeEngine(end_probs={"Hello.": 0.9})
    session, _, _ = with_hazard(engine, FakeJudge(0.9))
    session._act_now(ScoreText(1, "Hello.", "Hello"))
    (scored,) = [r for r in engine.requests if r.score_end]
    await session.close()  # before the reader's first step
    await until(lambda: scored.request_id in engine.cancelled)


async def test_hazard_an_engine_with_a_turn_head_is_asked_once_and_its_head_decides():
    text = "Book me a table for two."
    engine = FakeEngine(end_probs={text: 1e-4}, turn_probs={text: 0.99})
    session, asr, events = with_hazard(engine, FakeJudge(0.5))
    await send(session, audio(("voice", 1.0), ("silence", 0.25)))  # under today's 400 ms
    asr.answer(asr.decodes[-1], text)
    await until(lambda: finals(events))
    assert [r.messages[-1].content for r in engine.requests if r.score_end] == [text]


async def test_hazard_a_turn_head_that_doubts_holds_the_turn_the_zero_shot_score_would_end():
    text = "Book me a table."
    engine = FakeEngine(end_probs={text: 0.9, "Book me a table": 0.9}, turn_probs={text: 0.001})
    session, asr, events = with_hazard(engine, FakeJudge(0.5))
    await send(session, audio(("voice", 1.0), ("silence", 0.25)))
    asr.answer(asr.decodes[-1], text)
    await judged_incomplete(session)
    assert finals(events) == []


async def test_hazard_doubt_keeps_listening_through_a_pause_and_the_turn_ends_after_it():
    first, whole = "I need eggs.", "I need eggs, milk and bread."
    ends = {first: 0.001, "I need eggs": 1e-6, whole: 0.9, whole.rstrip("."): 0.5}
    engine = FakeEngine(end_probs=ends)
    session, asr, events = with_hazard(engine, FakeJudge(0.5))
    await send(session, audio(("voice", 1.0), ("silence", 0.25)))
    asr.answer(asr.decodes[-1], first)
    await judged_incomplete(session)
    await send(session, audio(("silence", 0.15), ("voice", 0.8), ("silence", 0.25)))
    assert finals(events) == []  # 400 ms of pause: not cut off
    asr.answer(asr.decodes[-1], whole)
    await until(lambda: finals(events))
    assert finals(events) == [whole]
    assert session.turns.habit.mean_ms is not None  # the pause they went on after
