"""The session with fake services (tests/agent/fakes.py): no models, no sleeping, whatever the
machine's load. A spoken turn end to end, barge-in that keeps what was said, cancel, the early
final decode with its warm prefill, typed text, history."""

from __future__ import annotations

import asyncio
import dataclasses
import time

import numpy as np
import pytest

from tests.agent.fakes import EnergyVad, FakeAsr, FakeEngine
from voicert.agent.session import Services, Session
from voicert.audio.pcm import encode_pcm16
from voicert.config import Config
from voicert.core import events as ev
from voicert.core.llm import Sampling
from voicert.core.speech import EARLY, FINAL, PARTIAL
from voicert.protocol import native as p


def make(asr=None, engine=None, early_final_ms=0, partial_interval_ms=0, preempt=True, **vad):
    cfg = Config()
    cfg = dataclasses.replace(
        cfg,
        asr=dataclasses.replace(
            cfg.asr, early_final_ms=early_final_ms, partial_interval_ms=partial_interval_ms
        ),
        vad=dataclasses.replace(cfg.vad, **vad),
        turn=dataclasses.replace(cfg.turn, preempt=preempt),
    )
    svc = Services(cfg=cfg, vad=EnergyVad(), asr=asr or FakeAsr(), engine=engine or FakeEngine())
    events: list = []

    async def emit(event):
        events.append(event)

    return Session("s1", p.SessionStart(), svc, emit), svc, events


async def say(session, seconds_voice=1.0, seconds_silence=0.6):
    """Speech-like audio then silence, in 20 ms frames, as a client sends it (no pacing needed:
    turn-taking runs on audio time)."""
    x = np.concatenate(
        [
            0.3 * np.sin(np.arange(int(16000 * seconds_voice)) * 0.05),
            np.zeros(int(16000 * seconds_silence)),
        ]
    ).astype(np.float32)
    for i in range(0, x.size, 320):
        await session.on_audio(encode_pcm16(x[i : i + 320]))


async def until(cond, limit: int = 100_000) -> None:
    """Let the session's tasks run until ``cond()`` holds (a bounded number of loop turns: a
    broken session fails the test instead of hanging it)."""
    for _ in range(limit):
        if cond():
            return
        await asyncio.sleep(0)
    raise AssertionError("condition never held")


def kinds(events):
    return [type(e).__name__ for e in events]


async def test_a_spoken_turn_is_transcribed_answered_and_remembered():
    session, svc, events = make()
    await say(session)
    assert await session.wait_turn(10)
    assert kinds(events)[:5] == [
        "SpeechStarted",
        "BargeIn",
        "SpeechStopped",
        "TranscriptFinal",
        "ReplyStarted",
    ]
    tokens = [e for e in events if isinstance(e, ev.ReplyToken)]
    assert "".join(t.text for t in tokens) == "The capital of France is Paris."
    assert [t.index for t in tokens] == list(range(len(tokens)))
    done = next(e for e in events if isinstance(e, ev.ReplyDone))
    assert done.finish_reason == "stop" and done.text == "The capital of France is Paris."
    assert isinstance(events[-1], ev.TurnLatency)
    assert [(m.role, m.content) for m in session.history.messages()] == [
        ("user", "what is the capital of france"),
        ("assistant", "The capital of France is Paris."),
    ]
    (decode,) = svc.asr.decodes
    assert decode.priority == FINAL


async def test_speech_during_a_reply_interrupts_it_and_keeps_what_was_said():
    engine = FakeEngine(reply="one two three four five six", gated=True)
    session, _svc, events = make(engine=engine)
    await say(session)
    await until(lambda: engine.requests)
    first = engine.requests[0].request_id
    for n in (1, 2):  # two tokens out...
        engine.release(first)
        await until(lambda: sum(isinstance(e, ev.ReplyToken) for e in events) >= n)
    await say(session)  # ...then the caller talks over the reply
    await until(lambda: len(engine.requests) >= 2)
    engine.gated = False
    engine.release()
    assert await session.wait_turn(10)
    done = [e for e in events if isinstance(e, ev.ReplyDone)]
    assert done[0].finish_reason == "interrupted" and done[0].text == "one two"
    assert done[1].finish_reason == "stop"
    # the interrupted reply is in the history the second reply was asked with
    second = [(m.role, m.content) for m in engine.requests[1].messages]
    assert ("assistant", "one two") in second


async def test_response_cancel_stops_the_reply():
    engine = FakeEngine(gated=True)
    session, _, events = make(engine=engine)
    session.add_user_text("Hello?")
    session.respond()
    await until(lambda: engine.requests)
    engine.release()
    await until(lambda: any(isinstance(e, ev.ReplyToken) for e in events))
    session.cancel_response()
    assert await session.wait_turn(10)
    done = next(e for e in events if isinstance(e, ev.ReplyDone))
    assert done.finish_reason == "cancelled" and done.tokens == 1


async def test_the_early_decode_starts_the_reply_that_the_turn_then_sends():
    """turn.preempt: the reply is asked on the early transcript, before the endpoint; nothing of
    it is sent until the turn ends, and the turn takes that request (no second one)."""
    asr = FakeAsr(auto=False)
    engine = FakeEngine()
    session, _, events = make(asr=asr, engine=engine, early_final_ms=160, min_silence_ms=600)
    await say(session, seconds_silence=0.3)  # past 160 ms of silence, before the endpoint
    asr.answer(asr.decodes[0])
    await until(lambda: engine.requests)
    (ahead,) = engine.requests
    assert ahead.max_new_tokens == session.max_new_tokens
    assert ahead.messages[-1].content == asr.text
    assert not any(isinstance(e, (ev.ReplyStarted, ev.ReplyToken)) for e in events)
    await say(session, seconds_voice=0, seconds_silence=0.5)  # the endpoint confirms it
    assert await session.wait_turn(10)
    assert engine.requests == [ahead] and not engine.cancelled
    tokens = [e for e in events if isinstance(e, ev.ReplyToken)]
    assert "".join(t.text for t in tokens) == engine.reply
    assert kinds(events).index("TranscriptFinal") < kinds(events).index("ReplyToken")
    latency = events[-1]
    assert isinstance(latency, ev.TurnLatency) and latency.early_asr and latency.early_prefill


async def test_a_reply_started_ahead_is_not_taken_once_the_conversation_moved():
    """The system prompt changed between the early transcript and the endpoint: the reply
    started ahead is withdrawn and the turn asks again, with the new prompt."""
    asr = FakeAsr(auto=False)
    engine = FakeEngine()
    session, _, events = make(asr=asr, engine=engine, early_final_ms=160, min_silence_ms=600)
    await say(session, seconds_silence=0.3)
    asr.answer(asr.decodes[0])
    await until(lambda: engine.requests)
    session.set_system_prompt("Answer in French.")
    await say(session, seconds_voice=0, seconds_silence=0.5)
    assert await session.wait_turn(10)
    ahead, asked = engine.requests
    assert ahead.request_id in engine.cancelled and asked.request_id not in engine.cancelled
    assert asked.messages[0].content == "Answer in French."
    done = next(e for e in events if isinstance(e, ev.ReplyDone))
    assert done.finish_reason == "stop" and done.text == engine.reply


async def test_without_preempt_the_early_decode_prefills_the_prompt_only():
    asr = FakeAsr(auto=False)
    engine = FakeEngine()
    session, _, events = make(
        asr=asr, engine=engine, early_final_ms=160, min_silence_ms=600, preempt=False
    )
    await say(session, seconds_silence=0.3)  # past 160 ms of silence, before the endpoint
    (early,) = asr.decodes
    assert early.priority == EARLY
    asr.answer(early)  # the transcript is back before the endpoint...
    await until(lambda: engine.requests)
    warm = engine.requests[0]
    assert warm.max_new_tokens == 1 and warm.messages[-1].content == asr.text  # ...prefilled
    await say(session, seconds_voice=0, seconds_silence=0.5)  # the endpoint confirms it
    assert await session.wait_turn(10)
    assert len(asr.decodes) == 1  # no second decode
    latency = events[-1]
    assert isinstance(latency, ev.TurnLatency) and latency.early_asr and latency.early_prefill
    assert not any(
        isinstance(e, ev.ReplyToken) and e.text == "The" and e.index != 0 for e in events
    )  # the warm request's token never reached the client


@pytest.mark.parametrize("preempt", [True, False])
async def test_talking_on_after_the_early_decode_drops_it_and_what_it_started(preempt):
    asr = FakeAsr(auto=False)
    engine = FakeEngine()
    session, _, events = make(
        asr=asr, engine=engine, early_final_ms=160, min_silence_ms=600, preempt=preempt
    )
    await say(session, seconds_silence=0.3)
    asr.answer(asr.decodes[0])
    await until(lambda: engine.requests)
    await say(session, seconds_silence=0.0)  # the caller goes on talking
    assert engine.requests[0].request_id in engine.cancelled  # the reply (or prefill) withdrawn
    assert not any(isinstance(e, ev.ReplyToken) for e in events)


async def test_live_partials_grow_stable_text_and_a_late_one_is_dropped():
    asr = FakeAsr(auto=False)
    session, _, events = make(asr=asr, partial_interval_ms=300, min_silence_ms=600)

    def partials():
        return [
            (e.turn_id, e.stable, e.unstable) for e in events if isinstance(e, ev.TranscriptPartial)
        ]

    await say(session, seconds_silence=0.0)
    (first,) = asr.decodes  # one partial at a time: the next waits for this one
    assert first.priority == PARTIAL
    asr.answer(first, "what is the")
    await until(lambda: partials() == [(1, "", "what is the")])
    await say(session, seconds_voice=0.4, seconds_silence=0.0)
    second = asr.decodes[-1]
    assert second is not first and second.priority == PARTIAL
    asr.answer(second, "what is the weather")
    await until(lambda: len(partials()) == 2)
    assert partials()[-1] == (1, "what is the", "weather")  # two decodes agreed: stable grows
    await say(session, seconds_voice=0.0, seconds_silence=0.3)  # partials go on in the silence
    third = asr.decodes[-1]
    assert third.priority == PARTIAL and third is not second
    third.started = True  # running on the worker: it cannot be withdrawn
    await say(session, seconds_voice=0.0, seconds_silence=0.5)  # the endpoint
    final = asr.decodes[-1]
    assert final.priority == FINAL
    asr.answer(third, "what is the weather in")  # done after the endpoint: ignored
    asr.answer(final, "what is the weather in london")
    assert await session.wait_turn(10)
    assert len(partials()) == 2
    kinds_seen = kinds(events)
    assert kinds_seen.index("TranscriptPartial") < kinds_seen.index("TranscriptFinal")
    text = next(e.text for e in events if isinstance(e, ev.TranscriptFinal))
    assert text == "what is the weather in london"


async def test_typed_text_is_answered_and_too_long_text_is_refused():
    session, svc, events = make()
    session.add_user_text("What is the capital of France?")
    session.respond()
    assert await session.wait_turn(10)
    assert any(isinstance(e, ev.ReplyDone) for e in events)
    with pytest.raises(p.ProtocolError) as err:
        session.add_user_text("x" * (svc.cfg.server.max_text_chars + 1))
    assert err.value.code is p.ErrorCode.TEXT_TOO_LONG
    assert len(session.history) == 2  # nothing was added


async def test_close_withdraws_decodes_in_flight():
    asr = FakeAsr(auto=False)
    session, _, _ = make(asr=asr, early_final_ms=160, min_silence_ms=600)
    await say(session, seconds_silence=0.3)
    (early,) = asr.decodes
    await session.close()
    assert early.dropped


async def test_a_reply_that_fails_before_a_word_is_apologised_for_and_kept_out_of_history():
    engine = FakeEngine(fail="the LLM server is unavailable")
    session, svc, events = make(engine=engine)
    session.add_user_text("Hello?")
    session.respond()
    assert await session.wait_turn(10)
    error = next(e for e in events if isinstance(e, ev.SessionError))
    assert error.code == p.ErrorCode.ENGINE_FAILED.value and "unavailable" in error.message
    tokens = [e.text for e in events if isinstance(e, ev.ReplyToken)]
    assert tokens == [svc.cfg.llm.apology]
    done = next(e for e in events if isinstance(e, ev.ReplyDone))
    assert done.finish_reason == "error" and done.text == svc.cfg.llm.apology
    assert [m.role for m in session.history.messages()] == ["user"]  # no apology to build on
    # the session goes on: the next turn is answered
    engine.fail = ""
    session.add_user_text("Hello again?")
    session.respond()
    assert await session.wait_turn(10)
    assert [e for e in events if isinstance(e, ev.ReplyDone)][-1].finish_reason == "stop"


async def test_no_apology_when_it_is_configured_off():
    session, svc, events = make(engine=FakeEngine(fail="down"))
    session.cfg = dataclasses.replace(svc.cfg, llm=dataclasses.replace(svc.cfg.llm, apology=""))
    session.add_user_text("Hello?")
    session.respond()
    assert await session.wait_turn(10)
    assert not [e for e in events if isinstance(e, ev.ReplyToken)]


async def test_audio_far_faster_than_real_time_is_dropped_with_one_error_a_second():
    """A session pushing audio at many times real time held back every other caller's turn: past
    the burst, frames are dropped and the client hears audio_too_fast (once a second, not per
    frame); the session goes on."""
    session, svc, _ = make()
    second = encode_pcm16(np.zeros(16000, np.float32))  # one second of audio a frame
    refused = []
    t0 = time.monotonic()
    for _ in range(100):  # 100 s of audio as fast as the loop takes it
        try:
            await session.on_audio(second)
        except p.ProtocolError as exc:
            refused.append(exc.code)
    took = time.monotonic() - t0
    assert svc.cfg.server.max_audio_rate == 2.0 and svc.cfg.server.audio_burst_s == 30.0
    # 30 s of burst and twice the time it took were taken (whole frames); the rest was dropped
    assert 70 - 2 * took - 1 <= session.audio_dropped_s <= 70
    assert refused[0] == p.ErrorCode.AUDIO_TOO_FAST and set(refused) == {refused[0]}
    assert len(refused) <= took + 1  # at most one error a second, not one per dropped frame


async def test_a_session_temperature_samples_its_replies():
    engine = FakeEngine()
    session, _, _ = make(engine=engine)
    session.add_user_text("Hello?")
    session.respond()
    assert await session.wait_turn(10)
    assert engine.requests[-1].sampling.greedy
    session.settings = dataclasses.replace(session.settings, temperature=0.7)
    session.respond()
    assert await session.wait_turn(10)
    assert engine.requests[-1].sampling == Sampling(0.7)
    session.settings = dataclasses.replace(session.settings, top_p=0.9, top_k=40, seed=5)
    session.respond()
    assert await session.wait_turn(10)
    assert engine.requests[-1].sampling == Sampling(0.7, 0.9, 40, 5)


async def test_no_reply_is_started_ahead_when_turns_are_not_answered_by_themselves():
    asr = FakeAsr(auto=False)
    engine = FakeEngine()
    session, _, _ = make(asr=asr, engine=engine, early_final_ms=160, min_silence_ms=600)
    session.auto_respond = False  # the client asks for each reply (create_response: false)
    await say(session, seconds_silence=0.3)
    asr.answer(asr.decodes[0])
    await say(session, seconds_voice=0, seconds_silence=0.5)
    assert await session.wait_turn(10)
    assert not engine.requests


class FakeClock:
    """``time.perf_counter_ns`` that moves only when the test moves it."""

    def __init__(self) -> None:
        self.ns = 10**12

    def __call__(self) -> int:
        return self.ns


@pytest.mark.parametrize("behind_ms", [0, 500])
async def test_audio_handled_late_is_ingest_lag_counted_in_ttft_and_v2ft(monkeypatch, behind_ms):
    """The caller's frames each 20 ms; from the end of their speech on, the server handles each
    ``behind_ms`` late (a backlog: frames wait in the socket, the reader never idles)."""
    clock = FakeClock()
    monkeypatch.setattr(time, "perf_counter_ns", clock)
    session, _, events = make()
    x = np.concatenate([0.3 * np.sin(np.arange(16000) * 0.05), np.zeros(int(16000 * 0.6))]).astype(
        np.float32
    )
    frame_ns = 20_000_000
    for k, i in enumerate(range(0, x.size, 320)):
        made = 10**12 + (k + 1) * frame_ns  # the frame's last sample, on the caller's clock
        late = i >= 16000  # the silence: behind
        clock.ns = made + (behind_ms * 1_000_000 if late else 0)
        if not late:
            session.caller_idle()  # the reader waited for this frame
        await session.on_audio(encode_pcm16(x[i : i + 320]))
        if any(isinstance(e, ev.SpeechStopped) for e in events):
            break  # decided: the reply runs while the clock stands still
    assert await session.wait_turn(10)
    (lat,) = [e for e in events if isinstance(e, ev.TurnLatency)]
    s = lat.stages
    assert s["ingest_ms"] == behind_ms  # a stage of its own
    assert s["ttft_ms"] == behind_ms  # the engine's part takes no fake time
    assert s["voice_to_first_token_ms"] == s["endpoint_ms"] + behind_ms
    assert 400 <= s["endpoint_ms"] <= 460  # the caller's silence, whatever the server's lag
