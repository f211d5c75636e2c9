"""voicert B with ``llm.engine: openai`` pointed at voicert A's ``/v1/chat/completions`` (the
``server`` fixture, real embedded models): spoken turns with history, a barge-in that stops A's
generation, and an LLM server that is down giving B's caller a typed error and an apology while
the session lives on."""

from __future__ import annotations

import asyncio
import dataclasses
import socket

import numpy as np
import pytest
from websockets.asyncio.client import connect

from tests.conftest import wav
from voicert.audio.pcm import encode_pcm16
from voicert.engine.clients.openai_compat import OpenAICompatEngine
from voicert.protocol import native as p
from voicert.server.app import STREAM_PATH, VoiceServer
from voicert.server.completions import EMBEDDED_MODEL_ID

pytestmark = pytest.mark.models


async def voicert_b(services, base_url: str) -> VoiceServer:
    cfg = services.cfg
    cfg = dataclasses.replace(
        cfg,
        server=dataclasses.replace(cfg.server, port=0),
        turn=dataclasses.replace(cfg.turn, detector="silence"),
        llm=dataclasses.replace(
            cfg.llm,
            engine="openai",
            base_url=base_url,
            model=EMBEDDED_MODEL_ID,
            first_token_timeout_s=120,
            stall_timeout_s=120,
        ),
    )
    srv = VoiceServer(
        dataclasses.replace(
            services, cfg=cfg, engine=OpenAICompatEngine(cfg.llm, EMBEDDED_MODEL_ID)
        )
    )
    await srv.start()
    return srv


async def send_speech(ws, name: str) -> None:
    x, _ = wav(name)
    for chunk in np.array_split(np.concatenate([x, np.zeros(16000, np.float32)]), 8):
        await ws.send(p.encode(p.Audio(encode_pcm16(chunk))))


async def events_until(ws, done, limit_s=120) -> list[dict]:
    out = []
    while True:
        ev = p.decode_server(await asyncio.wait_for(ws.recv(), limit_s))
        out.append(ev)
        if done(ev):
            return out


def turn_latency(turn_id):
    return lambda ev: ev["type"] == "turn.latency" and ev["turn_id"] == turn_id


async def test_spoken_turns_with_history_and_a_barge_in_that_stops_the_remote_generation(
    server, services
):
    a_engine = services.engine
    b = await voicert_b(services, f"http://127.0.0.1:{server.port}/v1")
    try:
        submitted = a_engine.stats().submitted
        async with connect(f"ws://127.0.0.1:{b.port}{STREAM_PATH}") as ws:
            await ws.send(p.encode(p.SessionStart(max_new_tokens=400)))
            await send_speech(ws, "capital_of_france")
            events = await events_until(ws, turn_latency(1))
            await send_speech(ws, "what_about_germany")
            events += await events_until(ws, turn_latency(2))
            # a long reply, then the caller speaks over it
            await ws.send(
                p.encode(
                    p.SessionUpdate(system_prompt="Answer at great length, with many details.")
                )
            )
            await ws.send(p.encode(p.UserText("Tell me everything about the history of Rome.")))
            events += await events_until(
                ws, lambda ev: ev["type"] == "response.token" and ev["turn_id"] == 3
            )
            cancelled = a_engine.stats().cancelled
            await send_speech(ws, "capital_of_france")
            events += await events_until(ws, turn_latency(4))
        done = {e["turn_id"]: e for e in events if e["type"] == "response.done"}
        assert not [e for e in events if e["type"] == "error"]
        assert "paris" in done[1]["text"].lower()
        assert "berlin" in done[2]["text"].lower(), done[2]["text"]  # needs turn 1 in the prompt
        assert done[2]["prompt_tokens"] > done[1]["prompt_tokens"] + 10  # A's count, via usage
        assert done[3]["finish_reason"] == "interrupted" and done[3]["tokens"] < 400
        assert "paris" in done[4]["text"].lower()
        assert a_engine.stats().submitted > submitted + 3
        for _ in range(200):  # A stopped generating the interrupted reply
            if not a_engine.live_requests():
                break
            await asyncio.sleep(0.05)
        assert not a_engine.live_requests()
        assert a_engine.stats().cancelled >= cancelled + 1
        latency = next(e for e in events if e["type"] == "turn.latency")["stages"]
        assert latency["prefill_ms"] > 0 and latency["ttft_ms"] > 0
    finally:
        await b.shutdown()


async def test_an_llm_server_that_is_down_gets_an_apology_and_the_session_lives_on(services):
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    b = await voicert_b(services, f"http://127.0.0.1:{port}/v1")
    try:
        async with connect(f"ws://127.0.0.1:{b.port}{STREAM_PATH}") as ws:
            await ws.send(p.encode(p.SessionStart()))
            for turn in (1, 2):
                await ws.send(p.encode(p.UserText("What is the capital of France?")))
                events = await events_until(ws, turn_latency(turn))
                error = next(e for e in events if e["type"] == "error")
                assert error["code"] == p.ErrorCode.ENGINE_FAILED.value
                assert "unavailable" in error["message"]
                done = next(e for e in events if e["type"] == "response.done")
                assert done["finish_reason"] == "error"
                assert done["text"] == b.cfg.llm.apology
    finally:
        await b.shutdown()


async def test_a_tool_call_made_by_the_remote_model_reaches_the_caller(server, services):
    import json

    from voicert.core.chat import ToolChoice, ToolChoiceMode, ToolSpec

    weather = ToolSpec.of(
        "get_weather",
        "The weather in a city.",
        {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    )
    b = await voicert_b(services, f"http://127.0.0.1:{server.port}/v1")
    try:
        async with connect(f"ws://127.0.0.1:{b.port}{STREAM_PATH}") as ws:
            await ws.send(
                p.encode(
                    p.SessionStart(
                        tools=(weather,),
                        tool_choice=ToolChoice(ToolChoiceMode.NAMED, "get_weather"),
                    )
                )
            )
            await ws.send(p.encode(p.UserText("What's the weather like in Paris?")))
            events = await events_until(ws, lambda ev: ev["type"] == "response.done")
        started = next(e for e in events if e["type"] == "tool.call.started")
        call = next(e for e in events if e["type"] == "tool.call")
        assert started["name"] == call["name"] == "get_weather"
        assert isinstance(json.loads(call["arguments"])["city"], str)
        deltas = [e["delta"] for e in events if e["type"] == "tool.call.delta"]
        assert "".join(deltas) == call["arguments"]  # streamed as A decoded them
        assert not [e for e in events if e["type"] == "error"]
    finally:
        await b.shutdown()
