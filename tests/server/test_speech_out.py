"""Speech out over the native protocol: the reply is spoken as it streams (real eSpeak NG), and what
it says is what Whisper hears."""

from __future__ import annotations

import asyncio

import numpy as np
from websockets.asyncio.client import connect

from tests.conftest import heard_the_answer, wav
from tests.server.test_stream import recv_until
from voicert.audio.pcm import decode_pcm
from voicert.client import stream_audio
from voicert.protocol import native as p


def hear(services, audio: np.ndarray) -> str:
    """What the server's own Whisper makes of 16 kHz audio."""
    segments, _ = services.asr.model.transcribe(audio, beam_size=1, language="en")
    return " ".join(s.text for s in segments).strip()


async def test_reply_is_spoken_and_whisper_hears_the_reply(url, services):
    result = await stream_audio(
        url, [wav("capital_of_france")], realtime=False, output_audio=p.OutputAudio("pcm16", 16000)
    )
    assert not result.errors, result.errors
    turn = result.turns[0]
    assert "paris" in turn.reply.lower()
    audio = decode_pcm(bytes(turn.audio), "pcm16")
    assert 0.8 < audio.size / 16000 < 10
    heard = hear(services, audio)
    assert heard_the_answer(heard), heard
    assert " ".join(turn.audio_pieces) == turn.reply.strip()  # every piece spoken, in order
    lat = turn.latency
    assert 0 < lat["tts_ms"] < lat["ttfa_ms"] and lat["ttfa_ms"] >= lat["ttft_ms"]
    parts = [
        lat["tts_wait_ms"],
        lat["tts_synth_ms"],
        lat["tts_out_ms"],
    ]  # the first piece's way out
    assert min(parts) >= 0 and abs(sum(parts) - lat["tts_ms"]) < 0.01
    kinds = [e["type"] for e in result.events]
    # the reply is done when its last audio is out
    assert kinds.index("response.started") < kinds.index("response.token")
    assert max(i for i, k in enumerate(kinds) if k == "response.audio") < kinds.index(
        "response.done"
    )
    seqs = [e["seq"] for e in result.events if e["type"] == "response.audio"]
    assert seqs == list(range(len(seqs)))


async def test_telephone_format_mulaw_8k_out(url, services):
    result = await stream_audio(
        url, [wav("capital_of_france")], realtime=False, output_audio=p.OutputAudio("mulaw", 8000)
    )
    turn = result.turns[0]
    audio8 = decode_pcm(bytes(turn.audio), "mulaw")  # one byte a sample
    import soxr

    heard = hear(services, soxr.resample(audio8, 8000, 16000).astype(np.float32))
    assert heard_the_answer(heard), heard


async def test_typed_user_text_gets_a_spoken_reply_and_joins_history(url):
    async with connect(url) as ws:
        await ws.send(p.encode(p.SessionStart(output_audio=p.OutputAudio("pcm16", 24000))))
        started = await recv_until(ws, "session.started")
        assert started["output_audio"] == {"encoding": "pcm16", "sample_rate": 24000}
        await ws.send(p.encode(p.UserText("What is the capital of France?")))
        done = await recv_until(ws, "response.done")
        assert "paris" in done["text"].lower() and done["finish_reason"] == "stop"
        await ws.send(p.encode(p.UserText("And what about Germany?")))
        done = await recv_until(ws, "response.done")
        assert "berlin" in done["text"].lower()
        latency = await recv_until(ws, "turn.latency")
        assert latency["stages"]["ttft_ms"] > 0 and latency["stages"]["ttfa_ms"] > 0
        await ws.send(p.encode(p.UserText("   ")))
        assert (await recv_until(ws, "error"))["code"] == "invalid_message"


async def spoken_reply(ws, text: str) -> np.ndarray:
    """Ask by text; the reply's audio (pcm16 at 16 kHz), once its response.done came."""
    await ws.send(p.encode(p.UserText(text)))
    chunks = []
    while True:
        msg = p.decode_server(await asyncio.wait_for(ws.recv(), 60))
        if msg["type"] == "response.audio":
            chunks.append(msg["audio"])
        elif msg["type"] == "response.done":
            return decode_pcm(b"".join(chunks), "pcm16")
        elif msg["type"] == "error":
            raise AssertionError(msg)


async def test_a_session_picks_its_voice_at_start_and_changes_it_mid_session(url, services):
    from tests.speech.test_tts import median_f0
    from voicert.server.completions import served_model_id

    out = p.OutputAudio("pcm16", 16000)
    async with connect(url) as ws:
        await ws.send(p.encode(p.SessionStart(output_audio=out, voice="en-us+f3")))
        started = await recv_until(ws, "session.started")
        default = services.tts.default_voice
        assert started["voice"] == "en-us+f3" and started["voices"][0] == default
        assert set(started["voices"]) == {default, "en-gb-x-rp", "en-us+f3"}
        assert started["model"] == served_model_id(services.cfg)
        female = median_f0(await spoken_reply(ws, "What is the capital of France?"), 16000)
        await ws.send(p.encode(p.SessionUpdate(voice="klingon")))
        err = await recv_until(ws, "error")
        assert err["code"] == "invalid_message" and "offered: " + default in err["message"]
        await ws.send(p.encode(p.SessionUpdate(voice=default)))  # a male voice, eSpeak or Piper
        male = median_f0(await spoken_reply(ws, "And what about Germany?"), 16000)
        assert male < 150 < female, (male, female)
    async with connect(url) as ws:  # a voice the server does not offer: no session
        await ws.send(p.encode(p.SessionStart(output_audio=out, voice="alloy")))
        err = await recv_until(ws, "error")
        assert err["code"] == "invalid_message" and "'alloy' is not offered" in err["message"]


async def test_bad_output_audio_formats_are_refused(url):
    for fmt, code in (
        (p.OutputAudio("opus", 24000), "unsupported_encoding"),
        (p.OutputAudio("pcm16", 12345), "unsupported_sample_rate"),
    ):
        async with connect(url) as ws:
            await ws.send(p.encode(p.SessionStart(output_audio=fmt)))
            assert (await recv_until(ws, "error"))["code"] == code


def test_the_native_door_cuts_history_at_a_barge_in_on_a_reply_sent_but_still_playing():
    # The door's pacing clock, fed the session's events as they go out: a spoken reply sent (and
    # done) at once, a barge-in 1.5 s into its 2 s of audio. The assistant item keeps what had
    # played (after the audio has ended, a barge-in keeps it whole: tests/transport).
    import time
    from types import SimpleNamespace

    from voicert.audio.playout import Playout
    from voicert.core import events as ev
    from voicert.protocol import native as p
    from voicert.server.connection import Connection
    from voicert.transport.spoken import PacingClock

    kept = []
    door = Connection.__new__(Connection)  # the pacing only: no socket
    door.clock = PacingClock()
    door.session = SimpleNamespace(
        settings=p.SessionStart(output_audio=p.OutputAudio("pcm16", 24000)),
        keep_heard=lambda *args: kept.append(args),
    )
    t0 = time.perf_counter_ns()
    door._pace(ev.ReplyStarted(5, spoken=True))
    door._pace(ev.ReplyAudio(5, 0, b"\0" * 48 * 1000, "One two three four."))
    door._pace(ev.ReplyAudio(5, 1, b"\0" * 48 * 1000, " Five six."))
    door._pace(ev.ReplyDone(5, "One two three four. Five six.", 8, 30, ev.ReplyEnd.STOP, "item_5"))
    assert kept == []  # done, not cut: it plays on
    door.clock.playout = Playout()  # as if the audio had gone out 1.5 s ago
    door.clock.playout.add(2_000_000_000, t0 - 1_500_000_000)
    door._pace(ev.BargeIn(6))
    ((item, chars, offset),) = kept
    assert item == "item_5" and offset == 0
    assert "One two three four. Five six."[:chars] == "One two three four. Five"
