"""``/twilio`` against a simulator that follows Twilio's published Media Streams formats: the caller
streams a WAV in real time, hears the spoken reply, marks come back as audio plays, and ``clear``
stops playback when the caller talks over it. Real models, real socket."""

from __future__ import annotations

import asyncio
import json

import numpy as np
import soxr
from websockets.asyncio.client import connect

from loadgen.twilio import TwilioCall
from tests.conftest import heard_the_answer, wav
from voicert.audio.pcm import decode_pcm
from voicert.protocol import twilio as tw


def twilio_url(server) -> str:
    return f"ws://127.0.0.1:{server.port}/twilio"


def hear(services, mulaw: bytes) -> str:
    x16 = soxr.resample(decode_pcm(bytes(mulaw), "mulaw"), 8000, 16000).astype(np.float32)
    segments, _ = services.asr.model.transcribe(x16, beam_size=1, language="en")
    return " ".join(s.text for s in segments).lower()


async def test_a_call_hears_the_spoken_reply_with_marks(server, services):
    async with TwilioCall(twilio_url(server)) as call:
        await call.speak(*wav("capital_of_france"))
        await call.wait_played()
        result = call.result
    heard = hear(services, result.played)
    assert heard_the_answer(heard), heard
    assert result.played == result.received  # everything sent was played (no barge-in)
    assert set(result.media_sizes) == {tw.FRAME_BYTES}  # 20 ms frames, as Twilio expects
    assert result.marks_echoed[-1] == "turn1-end" and result.clears == 0
    assert len(result.first_audio_after_speech_s) == 1
    assert result.close_code == 1000  # our "stop" ends the call cleanly


async def test_caller_talking_over_the_reply_clears_playback(server, services):
    async with TwilioCall(twilio_url(server)) as call:
        await call.speak(*wav("tell_me_a_joke"))
        while not call.result.received:  # the reply starts playing...
            await asyncio.sleep(0.02)
        await asyncio.sleep(0.3)
        await call.speak(*wav("capital_of_france"))  # ...and the caller talks over it
        for _ in range(200):
            if call.result.clears:
                break
            await asyncio.sleep(0.05)
        assert call.result.clears >= 1
        await call.wait_played()
        result = call.result
    assert len(result.played) < len(result.received)  # part of the first reply never played
    # the reply to the second question played in full after the clear (its words depend on the
    # interrupted history, so only check that it is speech)
    second = result.played[result.played_at_clear[-1] :]
    assert len(second) > 8000 // 2 and len(hear(services, second).split()) >= 2
    assert result.marks_played[-1].endswith("-end") and result.marks_played[-1] != "turn1-end"


async def test_dtmf_is_taken_and_bad_messages_do_not_end_the_call(server, services):
    async with TwilioCall(twilio_url(server)) as call:
        await call.ws.send("{not json")
        await call.ws.send(json.dumps({"event": "media", "media": {"payload": "%%%"}}))
        await call.ws.send(json.dumps({"event": "someFutureEvent"}))
        await call.ws.send(call.side.writer.dtmf("5"))
        await call.speak(*wav("capital_of_france"))
        await call.wait_played()
        heard = hear(services, call.result.played)
        assert heard_the_answer(heard), heard


async def test_media_before_start_and_wrong_format_close_the_stream(server):
    inbound = tw.InboundWriter("MZ1", "CA1")
    async with connect(twilio_url(server)) as ws:
        await ws.send(inbound.connected())
        await ws.send(inbound.media(b"\xff" * 160, 0))
        await asyncio.wait_for(ws.wait_closed(), 60)
        assert ws.close_code == 1008 and "before start" in ws.close_reason
    async with connect(twilio_url(server)) as ws:
        await ws.send(inbound.start(encoding="audio/l16", sample_rate=16000))
        await asyncio.wait_for(ws.wait_closed(), 60)
        assert ws.close_code == 1003 and "media format" in ws.close_reason
