"""Turn-taking behaviour of a session over the real server: early final transcript, early prefill,
barge-in, and no turns from silence or noise."""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import logging

import numpy as np
import pytest
from websockets.asyncio.client import connect

from tests.conftest import wav
from voicert.audio.pcm import encode_pcm16
from voicert.bench.asr_eval import normalize
from voicert.client import stream_audio
from voicert.protocol import native as p
from voicert.server.app import STREAM_PATH, VoiceServer


async def server_with(services, asr=None, turn=None, **vad):
    cfg = services.cfg
    cfg = dataclasses.replace(
        cfg,
        server=dataclasses.replace(cfg.server, port=0),
        vad=dataclasses.replace(cfg.vad, **vad),
        asr=dataclasses.replace(cfg.asr, **(asr or {})),
        turn=dataclasses.replace(cfg.turn, **(turn or {})),
    )
    srv = VoiceServer(dataclasses.replace(services, cfg=cfg))
    await srv.start()
    return srv


async def send_realtime(ws, x: np.ndarray, rate: int = 16000) -> None:
    n = rate // 50
    t0 = asyncio.get_running_loop().time()
    for i, start in enumerate(range(0, x.size, n)):
        await ws.send(p.encode(p.Audio(encode_pcm16(x[start : start + n]))))
        delay = t0 + (i + 1) * 0.02 - asyncio.get_running_loop().time()
        if delay > 0:
            await asyncio.sleep(delay)


async def test_early_final_transcript_and_early_prefill(services):
    # The decisions themselves are tested on a fake clock (test_turns.py, test_session_logic.py);
    # here, real models over a real socket. An 8 s endpoint silence leaves the early decode and
    # the warm prefill time to finish first even when a busy machine makes them slow: with 3 s, a
    # fresh CI checkout's first decode on two loaded cores came in after the endpoint once (the
    # early transcript was used, its warm prefill never started). The client sends silence until
    # the turn is answered, as a live microphone does.
    srv = await server_with(services, turn={"detector": "silence"}, min_silence_ms=8000)
    try:
        result = await stream_audio(
            f"ws://127.0.0.1:{srv.port}{STREAM_PATH}",
            [wav("capital_of_france")],
            trailing_silence_s=1.0,
        )
    finally:
        await srv.shutdown()
    lat = next(e for e in result.events if e["type"] == "turn.latency")
    assert lat["early_asr"] and lat["early_prefill"]
    assert lat["stages"]["asr_wait_ms"] < 0  # the decode began before the endpoint
    # the silence rule decided on a frame that had arrived: its share of endpoint_ms is reported
    assert 0 <= lat["stages"]["decide_ms"] < lat["stages"]["endpoint_ms"]
    # at the endpoint the transcript was ready: the turn waited less for it than the silence
    assert lat["stages"]["asr_ms"] < lat["stages"]["endpoint_ms"]
    turn = result.turns[0]
    assert "paris" in turn.reply.lower()
    tokens = [e for e in result.events if e["type"] == "response.token"]
    # the warm-up request's token never reached the client
    assert [t["index"] for t in tokens] == list(range(turn.done["tokens"]))


@pytest.mark.parametrize("detector, model", [("semantic", "smart_turn"), ("hazard", "none")])
async def test_a_pause_after_an_incomplete_phrase_does_not_cut_the_speaker_off(
    services, detector, model
):
    # real models: "My name is John and I want to | (750 ms) change my booking." is one turn.
    # semantic: its verdict waits for both cues. hazard (the default, without the audio model):
    # its opinions come late on a busy machine, and a late verdict can only end the turn later
    # (speech that resumes first drops the judgement), never sooner. Both whatever the load, so
    # with no deadline on the opinions: at turn.decide_by_ms (600 ms) a busy machine's pause
    # with none of them in yet is decided on nothing (~750 ms for the hazard), which cuts this
    # 750 ms pause or not by the load (tests/agent/test_turns_semantic.py tests the deadline)
    assert services.cfg.turn.detector == "hazard" and services.turn_judge is not None
    turn = {"detector": detector, "model": model, "decide_by_ms": 1600}
    srv = await server_with(services, turn=turn)
    try:
        result = await stream_audio(
            f"ws://127.0.0.1:{srv.port}{STREAM_PATH}", [wav("turns/p03")], trailing_silence_s=2.5
        )
    finally:
        await srv.shutdown()
    finals = [e["text"] for e in result.events if e["type"] == "transcript.final"]
    assert len(finals) == 1 and "john" in finals[0].lower() and "change" in finals[0].lower()


async def test_the_hazard_detector_ends_a_question_on_the_llms_own_score(services):
    # real models: the early transcript is scored by the engine (score_end) and the turn ends
    # from the audio model's and the LLM's opinions, however late they come (the client keeps
    # sending silence past the maximum wait; no deadline decides without them here)
    assert services.engine.scores
    registry = services.metrics.registry
    before = registry.get_sample_value("voicert_turn_text_score_seconds_count") or 0
    srv = await server_with(services, turn={"detector": "hazard", "decide_by_ms": 1600})
    try:
        result = await stream_audio(
            f"ws://127.0.0.1:{srv.port}{STREAM_PATH}",
            [wav("capital_of_france")],
            trailing_silence_s=2.5,
        )
    finally:
        await srv.shutdown()
    finals = [e["text"] for e in result.events if e["type"] == "transcript.final"]
    assert len(finals) == 1 and "france" in finals[0].lower()
    assert "paris" in result.turns[0].reply.lower()
    assert registry.get_sample_value("voicert_turn_text_score_seconds_count") > before


async def test_speech_during_a_reply_interrupts_it(url):
    x, _ = wav("count_to_five")
    q, _ = wav("capital_of_france")
    async with connect(url) as ws:
        await ws.send(
            p.encode(
                p.SessionStart(
                    system_prompt="Answer at great length, with many details.", max_new_tokens=400
                )
            )
        )
        for chunk in np.array_split(np.concatenate([x, np.zeros(16000, np.float32)]), 8):
            await ws.send(p.encode(p.Audio(encode_pcm16(chunk))))
        events = []
        while not any(e["type"] == "response.token" for e in events):
            events.append(p.decode_server(await asyncio.wait_for(ws.recv(), 60)))
        for chunk in np.array_split(np.concatenate([q, np.zeros(16000, np.float32)]), 8):
            await ws.send(p.encode(p.Audio(encode_pcm16(chunk))))
        while True:
            ev = p.decode_server(await asyncio.wait_for(ws.recv(), 60))
            events.append(ev)
            if ev["type"] == "turn.latency" and ev["turn_id"] == 2:
                break
    done = {e["turn_id"]: e for e in events if e["type"] == "response.done"}
    assert done[1]["finish_reason"] == "interrupted" and done[1]["tokens"] < 400
    assert done[1]["text"]  # the truncated reply is kept ...
    assert done[2]["prompt_tokens"] > done[1]["prompt_tokens"] + 5  # ... and in the history
    assert "paris" in done[2]["text"].lower()


def tones(seconds: float) -> np.ndarray:
    """Music-like: a chord that changes every 250 ms, with a beat."""
    t = np.arange(int(16000 * seconds)) / 16000
    out = np.zeros_like(t)
    for k, f0 in enumerate([220, 262, 330, 392] * int(seconds * 4 + 1)):
        seg = (t >= k * 0.25) & (t < (k + 1) * 0.25)
        for mult in (1, 1.25, 1.5):
            out[seg] += np.sin(2 * np.pi * f0 * mult * t[seg])
    return (0.15 * out / 3 * (0.6 + 0.4 * np.sin(2 * np.pi * 2 * t))).astype(np.float32)


async def test_no_turn_from_silence_or_noise(url):
    """Silence, white noise and tones, each a caller of its own, all at once (as callers are)."""
    rng = np.random.default_rng(1)
    audio = {
        "silence": np.zeros(16000 * 3, np.float32),
        "white_noise": (0.1 * rng.standard_normal(16000 * 3)).astype(np.float32),
        "tones": tones(3.0),
    }

    async def events_of(x: np.ndarray) -> list[dict]:
        async with connect(url) as ws:
            await ws.send(p.encode(p.SessionStart()))
            await asyncio.wait_for(ws.recv(), 60)
            await send_realtime(ws, np.concatenate([x, np.zeros(16000, np.float32)]))
            events = []
            try:
                while True:
                    events.append(p.decode_server(await asyncio.wait_for(ws.recv(), 3.0)))
            except TimeoutError:
                return events

    heard = dict(zip(audio, await asyncio.gather(*map(events_of, audio.values()))))
    for kind, events in heard.items():
        kinds = [e["type"] for e in events]
        assert "response.token" not in kinds and "turn.latency" not in kinds, (kind, events)
        assert all(not e["text"] for e in events if e["type"] == "transcript.final"), (kind, events)


async def test_live_partial_transcripts_grow_stable_text(services):
    # The partial schedule and the session's handling of partials (growth, a late one dropped at
    # the endpoint) are tested on a fake clock (test_turns.py, test_session_logic.py). Here, real
    # models over a real socket, paced by events, not by time: no endpoint comes from silence (10
    # min), the client says the question then, as a live microphone does, sends silence until a
    # partial has heard the whole question (however slow the machine), and ends the turn itself.
    # Silence endpointing: the semantic detector's decodes at the speech's own pauses would keep
    # the ASR worker busy, and partials back off while it is.
    srv = await server_with(
        services,
        asr={"partial_interval_ms": 300, "early_final_ms": 0},
        turn={"detector": "silence"},
        min_silence_ms=600_000,
    )
    samples, rate = wav("weather_question")
    events: list[dict] = []
    final = asyncio.Event()
    try:
        async with connect(f"ws://127.0.0.1:{srv.port}{STREAM_PATH}") as ws:
            await ws.send(p.encode(p.SessionStart(sample_rate=rate)))
            assert p.decode_server(await ws.recv())["type"] == "session.started"

            async def read() -> None:
                async for frame in ws:
                    events.append(p.decode_server(frame))
                    if events[-1]["type"] == "transcript.final":
                        final.set()

            reader = asyncio.create_task(read())

            def heard_it_all() -> bool:
                return any(
                    len(normalize(e["stable"] + " " + e["unstable"])) >= 4
                    for e in events
                    if e["type"] == "transcript.partial"
                )

            await send_realtime(ws, samples, rate)
            silence = np.zeros(rate // 10, np.float32)
            for _ in range(250):  # at most 25 s more (the utterance limit is 30 s)
                if heard_it_all():
                    break
                await send_realtime(ws, silence, rate)
            await ws.send(p.encode(p.AudioCommit()))
            await asyncio.wait_for(final.wait(), 120)  # bounded: a broken server fails
            reader.cancel()
    finally:
        await srv.shutdown()
    kinds = [e["type"] for e in events]
    partials = [e for e in events if e["type"] == "transcript.partial"]
    assert heard_it_all(), (kinds, partials)
    assert kinds.index("transcript.partial") < kinds.index("transcript.final")
    stables = [e["stable"] for e in partials]
    assert all(b.startswith(a) for a, b in itertools.pairwise(stables))  # stable only grows
    assert all(e["turn_id"] == 1 for e in partials)
    final = next(e for e in events if e["type"] == "transcript.final")
    assert "london" in final["text"].lower()
    heard = normalize(partials[-1]["stable"] + " " + partials[-1]["unstable"])
    assert heard[:2] == normalize(final["text"])[:2] == ["what", "is"], (heard, final["text"])


async def test_vad_on_worker_threads_gives_the_same_turns_as_on_the_loop(services, url):
    """vad.threads > 0 moves the model off the event loop; the events must not change."""
    import dataclasses
    from concurrent.futures import ThreadPoolExecutor

    from voicert.server.app import STREAM_PATH, VoiceServer

    pool = ThreadPoolExecutor(2, thread_name_prefix="test-vad")
    srv = VoiceServer(
        dataclasses.replace(
            services,
            vad_pool=pool,
            cfg=dataclasses.replace(
                services.cfg,
                server=dataclasses.replace(services.cfg.server, port=0),
                turn=dataclasses.replace(services.cfg.turn, detector="silence"),
            ),
        )
    )  # as the url fixture
    await srv.start()
    try:
        clips = [wav("capital_of_france"), wav("what_about_germany")]
        inline = await stream_audio(url, clips, realtime=False, until_answered=False)
        threaded = await stream_audio(
            f"ws://127.0.0.1:{srv.port}{STREAM_PATH}", clips, realtime=False, until_answered=False
        )
    finally:
        await srv.shutdown()
        pool.shutdown()

    def vad_events(result):
        return [
            (e["type"], e["audio_ms"])
            for e in result.events
            if e["type"] in ("vad.speech_started", "vad.speech_stopped")
        ]

    assert vad_events(threaded) == vad_events(inline) and len(vad_events(inline)) == 4
    assert [t.transcript for t in threaded.turns] == [t.transcript for t in inline.turns]


async def test_a_session_with_noise_suppression_still_hears_the_question(services):
    import importlib.metadata

    try:
        importlib.metadata.distribution("pyrnnoise")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("pyrnnoise is not installed")
    from voicert.speech.denoise import RnNoise

    cfg = services.cfg
    srv = VoiceServer(
        dataclasses.replace(
            services,
            denoise=RnNoise(),
            cfg=dataclasses.replace(
                cfg,
                server=dataclasses.replace(cfg.server, port=0),
                asr=dataclasses.replace(cfg.asr, denoise="rnnoise"),
                turn=dataclasses.replace(cfg.turn, detector="silence"),
            ),
        )
    )
    await srv.start()
    try:
        result = await stream_audio(
            f"ws://127.0.0.1:{srv.port}{STREAM_PATH}", [wav("weather_question")]
        )
    finally:
        await srv.shutdown()
    assert "weather" in result.turns[0].transcript.lower()


async def test_the_agents_own_voice_through_a_speakerphone_does_not_interrupt_it(services, caplog):
    # The screen itself is tested on real speech in tests/speech/test_echo.py; here the whole
    # loop: the reply's audio, as sent, comes back through the microphone (bench.turns' Room:
    # 150 ms later, 9 dB quieter, reverberant, noisy); with the guard off it interrupts itself.
    # Over that echo, the caller saying "stop, stop" still interrupts.
    from voicert.bench.turns import SET_DIR, interrupted, speakerphone

    # The simulated client plays and records in real time; when this machine is too busy for it
    # to keep time (it sent a frame over half a second late), its playback and the server's
    # idea of it part by that much and the run says nothing about the guard: it is run again
    # (at most three times), and the slips go in the messages.
    # The guard's judgements (its DEBUG log) of each run go in the messages too.
    question = "Tell me three facts about Paris."
    heard, slips, judged = {}, {}, {}
    caplog.set_level(logging.DEBUG, logger="voicert.speech.echo")

    async def real_time(key, *args, **kwargs):
        for _ in range(3):
            stats = {}
            caplog.clear()
            heard[key] = await speakerphone(*args, stats=stats, **kwargs)
            slips.setdefault(key, []).append(round(stats["max_slip_s"], 3))
            judged[key] = [
                f"client: chunk arrived, played from, ms: {stats['plays']}",
                *caplog.messages,
            ]
            if stats["max_slip_s"] <= 0.5:
                return

    for guard in (True, False):
        srv = await server_with(services, turn={"echo_guard": guard, "detector": "silence"})
        url = f"ws://127.0.0.1:{srv.port}{STREAM_PATH}"
        try:
            await real_time(guard, url, question, stop_on=None if guard else "vad.speech_started")
            if guard:
                stop, _ = wav_16k(SET_DIR / "i02.wav")
                await real_time(
                    "stop", url, question, interject=stop, max_new_tokens=64, stop_on="vad.barge_in"
                )
        finally:
            await srv.shutdown()

    def why(key) -> str:
        """The run's events (repeats counted; the VAD's with their audio_ms), the client's
        slips and the guard's log."""
        kinds = [
            f"{kind} x{len(list(run))}"
            for kind, run in itertools.groupby(
                e["type"] + (f"@{e['audio_ms']}" if "audio_ms" in e else "") for e in heard[key]
            )
        ]
        return "\n".join([f"events: {kinds}", f"client slips (s): {slips}", *judged[key]])

    kinds = [e["type"] for e in heard[True]]
    done = [e for e in heard[True] if e["type"] == "response.done"]
    spoken_s = sum(len(e["audio"]) for e in heard[True] if e["type"] == "response.audio") / 32000
    assert spoken_s > 1.5, (spoken_s, why(True))  # seconds of speech went out and came back
    assert "vad.barge_in" not in kinds and "vad.speech_started" not in kinds, why(True)
    assert len(done) == 1 and done[0]["finish_reason"] in ("stop", "length"), why(True)
    # without the screen the same loop interrupts itself (or answers its own words)
    assert "vad.speech_started" in [e["type"] for e in heard[False]], why(False)
    assert interrupted(heard["stop"]), why("stop")
    print("client slips (s) per run:", slips)


def wav_16k(path):
    from voicert.audio.wav import read_wav

    x, rate = read_wav(path)
    assert rate == 16000
    return x, rate
