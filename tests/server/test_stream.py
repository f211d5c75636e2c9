"""End to end over a real socket on 127.0.0.1 with the real embedded models."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import types
import urllib.error
import urllib.request

import msgpack
import numpy as np
import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

from tests.conftest import wav
from voicert.client import stream_audio
from voicert.core.llm import EngineBase, EngineState, EngineStats
from voicert.core.speech import AsrBase
from voicert.protocol import native as p
from voicert.server.app import STREAM_PATH, VoiceServer

STAGES = (
    "endpoint_ms",
    "asr_ms",
    "queue_ms",
    "prefill_ms",
    "first_token_ms",
    "send_ms",
    "ttft_ms",
    "voice_to_first_token_ms",
)


async def one_turn(url, name="capital_of_france", **kw):
    return await stream_audio(url, [wav(name)], realtime=False, **kw)


async def assert_server_still_serves(url):
    """A fresh session on the same server completes a full turn."""
    result = await one_turn(url)
    assert not result.errors
    turn = result.turns[0]
    assert "paris" in turn.reply.lower(), turn.reply
    assert turn.done["finish_reason"] == "stop"


async def recv_until(ws, kind, limit=200):
    for _ in range(limit):
        msg = p.decode_server(await asyncio.wait_for(ws.recv(), 60))
        if msg["type"] == kind:
            return msg
    raise AssertionError(f"no {kind}")


# ------------------------------------------------------------------ the happy path


async def test_capital_of_france_then_history_carries_to_the_next_turn(url):
    # until_answered=False: no silence is sent while the first reply is made, so the second
    # clip reaches the server after the same audio on every run. Sending silence until the
    # answer (as a microphone does) put as much silence before it as the reply took: on a busy
    # machine the VAD's onset, and tiny.en's decode with it, moved ("and watch them out to
    # Germany", answered "Paris").
    result = await stream_audio(
        url,
        [wav("capital_of_france"), wav("what_about_germany")],
        realtime=False,
        until_answered=False,
    )
    assert not result.errors, result.errors
    first, second = result.turns
    words = first.transcript.lower()
    assert "capital" in words and "france" in words
    assert "paris" in first.reply.lower()
    assert first.done["text"] == first.reply.strip()
    # turn 2 only makes sense with turn 1 in the prompt: "And what about Germany?"
    assert "germany" in second.transcript.lower()
    assert "berlin" in second.reply.lower(), second.reply
    assert second.done["prompt_tokens"] > first.done["prompt_tokens"] + 10
    kinds = [e["type"] for e in result.events]
    assert kinds.count("vad.speech_started") == 2 and kinds.count("vad.speech_stopped") == 2
    for turn in (first, second):
        for stage in STAGES:
            assert turn.latency[stage] > 0, (stage, turn.latency)
        lat = turn.latency
        assert lat["ttft_ms"] >= lat["asr_ms"] + lat["first_token_ms"]
        assert lat["voice_to_first_token_ms"] > lat["ttft_ms"]
    tokens = [e for e in result.events if e["type"] == "response.token" and e["turn_id"] == 1]
    assert [t["index"] for t in tokens] == list(range(first.done["tokens"]))


async def test_json_text_frames_and_48k_float_audio(url):
    x, _ = wav("capital_of_france")
    import soxr

    x48 = soxr.resample(x, 16000, 48000).astype(np.float32)
    async with connect(url) as ws:
        await ws.send(
            json.dumps({"type": "session.start", "sample_rate": 48000, "encoding": "f32"})
        )
        started = json.loads(await ws.recv())
        assert started["type"] == "session.started" and started["sample_rate"] == 48000
        audio = np.concatenate([x48, np.zeros(48000, np.float32)])
        for i in range(0, audio.size, 960):
            await ws.send(p.encode(p.Audio(audio[i : i + 960].tobytes()), binary=False))
        final = await recv_until(ws, "transcript.final")
        assert "france" in final["text"].lower()
        done = await recv_until(ws, "response.done")
        assert "paris" in done["text"].lower()


async def test_telephone_audio_8k_mulaw(url):
    audioop = pytest.importorskip("audioop")
    import soxr

    from voicert.audio.pcm import encode_pcm16

    x, _ = wav("capital_of_france")
    x8 = soxr.resample(np.concatenate([x, np.zeros(16000, np.float32)]), 16000, 8000)
    ulaw = audioop.lin2ulaw(encode_pcm16(x8.astype(np.float32)), 2)
    async with connect(url) as ws:
        await ws.send(p.encode(p.SessionStart(sample_rate=8000, encoding="mulaw")))
        await recv_until(ws, "session.started")
        for i in range(0, len(ulaw), 160):  # 20 ms frames, as telephony sends them
            await ws.send(p.encode(p.Audio(ulaw[i : i + 160])))
        final = await recv_until(ws, "transcript.final")
        assert "capital" in final["text"].lower() and "france" in final["text"].lower()
        await recv_until(ws, "response.done")


async def test_push_to_talk_commit_ends_the_turn(url):
    x, rate = wav("capital_of_france")
    async with connect(url) as ws:
        await ws.send(p.encode(p.SessionStart(sample_rate=rate, turn_detection="manual")))
        await recv_until(ws, "session.started")
        for frame in np.array_split(x, 50):
            await ws.send(p.encode(p.Audio((frame * 32767).astype("<i2").tobytes())))
        await ws.send(p.encode(p.AudioCommit()))
        final = await recv_until(ws, "transcript.final")
        assert "capital" in final["text"].lower()
        done = await recv_until(ws, "response.done")
        assert "paris" in done["text"].lower()


async def start_long_reply(ws) -> None:
    """Ask for a long reply (spoken question, verbose system prompt) and wait for its first token."""
    x, rate = wav("count_to_five")
    await ws.send(
        p.encode(
            p.SessionStart(
                sample_rate=rate,
                system_prompt="Answer at great length, with many details.",
                max_new_tokens=400,
            )
        )
    )
    await recv_until(ws, "session.started")
    for frame in np.array_split(np.concatenate([x, np.zeros(16000, np.float32)]), 60):
        await ws.send(p.encode(p.Audio((frame * 32767).astype("<i2").tobytes())))
    await recv_until(ws, "response.token")


async def test_response_cancel_stops_the_reply(url, services):
    async with connect(url) as ws:
        await start_long_reply(ws)
        await ws.send(p.encode(p.ResponseCancel()))
        done = await recv_until(ws, "response.done")
        assert done["finish_reason"] == "cancelled"
        assert done["tokens"] < 400
    assert not services.engine.live_requests()


# ------------------------------------------------------------------ bad input


async def expect_error(url, frames, code):
    async with connect(url) as ws:
        for f in frames:
            await ws.send(f)
        msg = await recv_until(ws, "error")
        assert msg["code"] == code.value, msg
        assert msg["message"]
        # the connection stays usable after a non-fatal error
        await ws.send(p.encode(p.SessionEnd()))
    return msg


async def test_non_msgpack_bytes(url):
    await expect_error(url, [b"\xc1\x00\xffnot msgpack"], p.ErrorCode.MALFORMED)
    await assert_server_still_serves(url)


async def test_unknown_type(url):
    msg = await expect_error(
        url, [msgpack.packb({"type": "audio.explode"})], p.ErrorCode.UNKNOWN_TYPE
    )
    assert "audio.explode" in msg["message"]
    await assert_server_still_serves(url)


async def test_audio_before_session_start(url):
    await expect_error(url, [p.encode(p.Audio(b"\x00\x00" * 320))], p.ErrorCode.NO_SESSION)
    await assert_server_still_serves(url)


async def test_unsupported_sample_rate(url):
    msg = await expect_error(
        url, [p.encode(p.SessionStart(sample_rate=12345))], p.ErrorCode.UNSUPPORTED_SAMPLE_RATE
    )
    assert "16000" in msg["message"]
    await assert_server_still_serves(url)


async def test_unsupported_encoding(url):
    await expect_error(
        url,
        [msgpack.packb({"type": "session.start", "encoding": "opus"})],
        p.ErrorCode.UNSUPPORTED_ENCODING,
    )
    await assert_server_still_serves(url)


async def test_odd_byte_count_audio(url):
    await expect_error(
        url, [p.encode(p.SessionStart()), p.encode(p.Audio(b"\x00\x01\x02"))], p.ErrorCode.BAD_AUDIO
    )
    await assert_server_still_serves(url)


async def test_message_over_the_size_limit_closes_with_1009(url, server):
    limit = server.cfg.server.max_message_bytes
    async with connect(url, max_size=None) as ws:
        await ws.send(p.encode(p.SessionStart()))
        await recv_until(ws, "session.started")
        await ws.send(p.encode(p.Audio(b"\x00" * (limit + 2))))
        with pytest.raises(ConnectionClosed):
            for _ in range(10):
                await asyncio.wait_for(ws.recv(), 60)
        assert ws.close_code == 1009
    await assert_server_still_serves(url)


async def test_disconnect_mid_reply_stops_generation_and_frees_state(url, services):
    engine = services.engine
    cancelled_before = engine.stats().cancelled
    ws = await connect(url)
    await start_long_reply(ws)
    assert engine.live_requests()
    ws.transport.abort()  # abrupt: no close frame
    for _ in range(100):
        if not engine.live_requests():
            break
        await asyncio.sleep(0.05)
    assert not engine.live_requests()
    assert engine.stats().cancelled == cancelled_before + 1
    await assert_server_still_serves(url)


# ------------------------------------------------------------------ HTTP routes and lifecycle


def _get(url):
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


async def test_metrics_endpoint_reports_turns_sessions_and_errors(url, server):
    await one_turn(url)
    await one_turn(url)  # shares the first one's system-prompt blocks
    await expect_error(url, [msgpack.packb({"type": "nope"})], p.ErrorCode.UNKNOWN_TYPE)
    status, body = await asyncio.to_thread(_get, f"http://127.0.0.1:{server.port}/metrics")
    assert status == 200
    from prometheus_client.parser import text_string_to_metric_families

    values = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for f in text_string_to_metric_families(body)
        for s in f.samples
    }
    assert values[("voicert_ttft_seconds_count", ())] >= 1
    assert values[("voicert_stage_latency_seconds_count", (("stage", "asr"),))] >= 1
    assert values[("voicert_errors_total", (("code", "unknown_type"),))] >= 1
    assert values[("voicert_asr_batch_size_count", ())] >= 1
    assert values[("voicert_engine_batch_size_count", ())] >= 1
    assert values[("voicert_active_sessions", ())] == 0  # every test session has ended
    assert 0 < values[("voicert_prefix_cache_hit_ratio", ())] <= 1


async def test_health_ready_and_unknown_routes(server):
    base = f"http://127.0.0.1:{server.port}"
    assert await asyncio.to_thread(_get, base + "/healthz") == (200, "ok\n")
    assert (await asyncio.to_thread(_get, base + "/readyz"))[0] == 200
    assert (await asyncio.to_thread(_get, base + "/nope"))[0] == 404
    with pytest.raises(InvalidStatus) as info:
        async with connect(f"ws://127.0.0.1:{server.port}/elsewhere"):
            pass
    assert info.value.response.status_code == 404


class _RestartingEngine(EngineBase):
    """An engine its supervisor is rebuilding (no request reaches it in this test)."""

    submit = cancel = close = None

    @property
    def state(self) -> EngineState:
        return EngineState.RESTARTING

    def stats(self) -> EngineStats:
        return EngineStats()


class _DownAsr(AsrBase):
    """A speech host being reconnected to."""

    submit = close = None

    def pending(self) -> int:
        return 0

    @property
    def alive(self) -> bool:
        return False


async def test_a_refusal_names_the_part_that_is_down(services):
    cfg = dataclasses.replace(services.cfg, server=dataclasses.replace(services.cfg.server, port=0))
    down = [
        ("engine", _RestartingEngine(), "engine restarting"),
        ("asr", _DownAsr(), "speech recognition down"),
        ("tts", types.SimpleNamespace(alive=False), "voice down"),
    ]
    for part, fake, why in down:
        srv = VoiceServer(dataclasses.replace(services, cfg=cfg, **{part: fake}))
        await srv.start()
        try:
            base = f"http://127.0.0.1:{srv.port}"
            assert (await asyncio.to_thread(_get, base + "/readyz")) == (
                503,
                f"not ready ({why})\n",
            )
            with pytest.raises(InvalidStatus) as info:
                async with connect(f"ws://127.0.0.1:{srv.port}{STREAM_PATH}"):
                    pass
            assert info.value.response.status_code == 503
            assert info.value.response.body.decode() == f"not ready ({why})\n"
        finally:
            await srv.shutdown()


async def test_not_ready_until_the_models_are_loaded(services):
    cfg = dataclasses.replace(services.cfg, server=dataclasses.replace(services.cfg.server, port=0))
    srv = VoiceServer(config=cfg)
    await srv.start()
    base = f"http://127.0.0.1:{srv.port}"
    try:
        assert (await asyncio.to_thread(_get, base + "/healthz"))[0] == 200
        assert (await asyncio.to_thread(_get, base + "/readyz")) == (
            503,
            "not ready (loading models)\n",
        )
        with pytest.raises(InvalidStatus) as info:
            async with connect(f"ws://127.0.0.1:{srv.port}{STREAM_PATH}"):
                pass
        assert info.value.response.status_code == 503
        srv.services = dataclasses.replace(services, cfg=cfg)  # what loading hands over
        assert (await asyncio.to_thread(_get, base + "/readyz")) == (200, "ready\n")
    finally:
        await srv.shutdown()


async def test_graceful_shutdown_lets_the_running_turn_finish(services):
    svc = dataclasses.replace(
        services,
        cfg=dataclasses.replace(
            services.cfg,
            server=dataclasses.replace(services.cfg.server, port=0, shutdown_grace_s=30),
        ),
    )
    srv = VoiceServer(svc)
    await srv.start()
    url = f"ws://127.0.0.1:{srv.port}{STREAM_PATH}"
    x, rate = wav("capital_of_france")
    async with connect(url) as ws:
        await ws.send(p.encode(p.SessionStart(sample_rate=rate)))
        await recv_until(ws, "session.started")
        for frame in np.array_split(np.concatenate([x, np.zeros(16000, np.float32)]), 60):
            await ws.send(p.encode(p.Audio((frame * 32767).astype("<i2").tobytes())))
        await recv_until(ws, "transcript.final")
        shutdown = asyncio.create_task(srv.shutdown())
        done = await recv_until(ws, "response.done")
        assert done["finish_reason"] == "stop" and "paris" in done["text"].lower()
        with pytest.raises(ConnectionClosed):
            for _ in range(10):
                await asyncio.wait_for(ws.recv(), 60)
        assert ws.close_code == 1001
    await asyncio.wait_for(shutdown, 30)
    with pytest.raises(OSError):
        async with connect(url, open_timeout=2):
            pass


async def test_slow_reader_is_disconnected_and_its_reply_freed(services):
    """A client that stops reading (its receive window full) while a long spoken reply streams:
    after server.send_timeout_s the server gives up on it (close 1008, its reply cancelled if still
    running), the engine holds nothing for it, and another session is served normally."""
    import socket

    srv = VoiceServer(
        dataclasses.replace(
            services,
            cfg=dataclasses.replace(
                services.cfg,
                server=dataclasses.replace(services.cfg.server, port=0, send_timeout_s=1.0),
            ),
        )
    )
    await srv.start()
    try:
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # a reader that falls behind
        sock.connect(("127.0.0.1", srv.port))
        ws = await connect(f"ws://127.0.0.1:{srv.port}{STREAM_PATH}", sock=sock, max_queue=1)
        await ws.send(
            p.encode(p.SessionStart(output_audio=p.OutputAudio("f32", 48000), max_new_tokens=200))
        )
        await recv_until(ws, "session.started")
        # loopback buffers autotune to megabytes; a small server-side send buffer stands in for a
        # long network path to a client that has stopped reading
        server_sock = next(iter(srv.connections)).ws.transport.get_extra_info("socket")
        server_sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 8192)
        await ws.send(p.encode(p.UserText("Count from one to one hundred, one number at a time.")))
        await asyncio.sleep(0.5)
        assert srv.connections  # the reply is streaming into the full socket
        for _ in range(200):  # never read: wait for the server to give up on this client
            if not srv.connections:
                break
            await asyncio.sleep(0.1)
        assert not srv.connections
        assert not services.engine.live_requests()  # the reply was cancelled, its state freed
        ws.transport.abort()
        await assert_server_still_serves(f"ws://127.0.0.1:{srv.port}{STREAM_PATH}")
    finally:
        await srv.shutdown()
