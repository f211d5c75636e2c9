"""The Realtime door's mapping on fake services (tests/agent/fakes.py): no models, no socket, no
sleeping. Client events in, the server events out validated against the official SDK's GA
models."""

from __future__ import annotations

import base64
import json
from typing import ClassVar

import numpy as np
import pytest

from tests.agent.fakes import EnergyVad, FakeAsr, FakeEngine
from tests.agent.test_session_logic import until
from voicert.agent.session import Services
from voicert.audio.pcm import encode_pcm16
from voicert.config import Config
from voicert.server.realtime import RealtimeConnection

pytest.importorskip("openai")


class FakeRequest:
    path = "/v1/realtime?model=m"
    headers: ClassVar[dict] = {}


class FakeWs:
    """Stands in for a websockets connection: what is sent is kept."""

    id = "ws-1"
    request = FakeRequest()

    def __init__(self) -> None:
        self.sent: list[dict] = []
        self.closed: tuple | None = None

    async def send(self, frame) -> None:
        self.sent.append(json.loads(frame))

    async def close(self, code: int = 1000, reason: str = "") -> None:
        self.closed = (code, reason)


async def open_door(engine=None):
    svc = Services(cfg=Config(), vad=EnergyVad(), asr=FakeAsr(), engine=engine or FakeEngine())
    ws = FakeWs()
    conn = RealtimeConnection(ws, svc)
    assert await conn.open()
    return conn, ws, svc


async def send(conn, **event) -> None:
    await conn.dispatch(json.dumps(event))


def types(ws) -> list[str]:
    return [e["type"] for e in ws.sent]


def assert_ga(ws) -> None:
    import warnings

    from openai.types.realtime import RealtimeServerEvent
    from pydantic import TypeAdapter

    adapter = TypeAdapter(RealtimeServerEvent)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for event in ws.sent:
            adapter.validate_python(event)


async def test_a_typed_question_gets_a_text_response_in_the_ga_shapes():
    conn, ws, _ = await open_door()
    await send(
        conn, type="session.update", session={"type": "realtime", "output_modalities": ["text"]}
    )
    await send(
        conn,
        type="conversation.item.create",
        item={"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hi"}]},
    )
    await send(conn, type="response.create")
    await until(lambda: "response.done" in types(ws))
    t = types(ws)
    assert t[:3] == ["session.created", "session.updated", "conversation.item.added"]
    assert (
        t.index("response.created")
        < t.index("response.output_text.delta")
        < t.index("response.output_text.done")
        < t.index("response.done")
    )
    deltas = "".join(e["delta"] for e in ws.sent if e["type"] == "response.output_text.delta")
    done = ws.sent[-1]["response"]
    assert deltas == "The capital of France is Paris." and done["status"] == "completed"
    assert done["output"][0]["content"] == [{"type": "output_text", "text": deltas}]
    assert_ga(ws)


async def test_speech_over_a_reply_interrupts_it_as_turn_detected():
    engine = FakeEngine(reply="one two three four five", gated=True)
    conn, ws, _ = await open_door(engine)
    await send(
        conn, type="session.update", session={"type": "realtime", "output_modalities": ["text"]}
    )
    voice = encode_pcm16((0.3 * np.sin(np.arange(24000) * 0.05)).astype(np.float32))
    silence = encode_pcm16(np.zeros(24000 * 6 // 10, np.float32))

    async def speak() -> None:  # 1 s of voice, 0.6 s of silence at 24 kHz, 20 ms frames
        audio = voice + silence
        for i in range(0, len(audio), 960):
            await send(
                conn,
                type="input_audio_buffer.append",
                audio=base64.b64encode(audio[i : i + 960]).decode(),
            )

    await speak()
    await until(lambda: engine.requests)
    engine.release()
    await until(lambda: "response.output_text.delta" in types(ws))
    await speak()  # the caller talks over the reply
    await until(lambda: types(ws).count("response.done") >= 1)
    first = next(e for e in ws.sent if e["type"] == "response.done")["response"]
    assert first["status"] == "cancelled"
    assert first["status_details"]["reason"] == "turn_detected"
    engine.gated = False
    engine.release()
    await until(lambda: types(ws).count("response.done") == 2)
    assert conn.session.history.messages()[1].content == "one"  # what was said of the first
    assert_ga(ws)


async def test_items_are_deleted_and_retrieved_by_their_wire_ids():
    conn, ws, _ = await open_door()
    await send(
        conn,
        type="conversation.item.create",
        item={
            "id": "item_a",
            "type": "message",
            "role": "user",
            "content": [{"type": "input_text", "text": "Remember: blue."}],
        },
    )
    await send(conn, type="conversation.item.retrieve", item_id="item_a")
    assert ws.sent[-1]["item"]["content"][0]["text"] == "Remember: blue."
    await send(conn, type="conversation.item.delete", item_id="item_a")
    assert ws.sent[-1] == {**ws.sent[-1], "type": "conversation.item.deleted", "item_id": "item_a"}
    assert not conn.session.history.messages()
    from voicert.protocol.realtime import RealtimeError

    for kind in ("conversation.item.retrieve", "conversation.item.delete"):
        with pytest.raises(RealtimeError, match="not found"):
            await send(conn, type=kind, item_id="item_a")
    assert_ga(ws)


async def test_semantic_vad_gives_the_session_the_semantic_detector_by_eagerness():
    conn, ws, svc = await open_door()
    await send(
        conn,
        type="session.update",
        session={
            "type": "realtime",
            "audio": {"input": {"turn_detection": {"type": "semantic_vad", "eagerness": "high"}}},
        },
    )
    updated = ws.sent[-1]
    assert updated["type"] == "session.updated"
    assert updated["session"]["audio"]["input"]["turn_detection"]["type"] == "semantic_vad"
    turns = conn.session.turns
    assert turns.semantic and turns.turn.max_silence_ms < svc.cfg.turn.max_silence_ms
    assert turns.turn.model == "none"  # no audio model on this server: the words judge
    await send(
        conn,
        type="session.update",
        session={
            "type": "realtime",
            "audio": {
                "input": {"turn_detection": {"type": "server_vad", "silence_duration_ms": 600}}
            },
        },
    )
    assert not conn.session.turns.semantic
    assert conn.session.turns.endpointer.cfg.min_silence_ms == 600
    assert_ga(ws)


WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "Weather in a city",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
}
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


@pytest.mark.parametrize("beta", [False, True])
async def test_a_function_call_round_trip_in_the_api_shapes(beta, monkeypatch):
    """session.tools -> a function_call item streamed as argument deltas -> the client's
    function_call_output item -> response.create -> the reply that uses it."""
    if beta:
        monkeypatch.setattr(FakeRequest, "headers", {"OpenAI-Beta": "realtime=v1"})
    engine = FakeEngine(script=[f"Let me check. {CALL}", "It is sunny in Paris."])
    conn, ws, _ = await open_door(engine)
    await send(
        conn,
        type="session.update",
        session={
            "type": "realtime",
            "output_modalities": ["text"],
            "tools": [WEATHER],
            "tool_choice": "auto",
        }
        if not beta
        else {"modalities": ["text"], "tools": [WEATHER]},
    )
    assert ws.sent[-1]["session"]["tools"][0]["name"] == "get_weather"
    await send(
        conn,
        type="conversation.item.create",
        item={
            "type": "message",
            "role": "user",
            "content": [{"type": "input_text", "text": "Weather in Paris?"}],
        },
    )
    await send(conn, type="response.create")
    await until(lambda: "response.done" in types(ws))
    done = ws.sent[-1]["response"]
    message, call = done["output"]
    assert message["type"] == "message" and call["type"] == "function_call"
    assert call["name"] == "get_weather" and json.loads(call["arguments"]) == {"city": "Paris"}
    deltas = "".join(
        e["delta"] for e in ws.sent if e["type"] == "response.function_call_arguments.delta"
    )
    assert deltas == call["arguments"]
    texts = "".join(e["delta"] for e in ws.sent if e["type"].endswith("text.delta"))
    assert texts.strip() == "Let me check."  # the call's text is never sent as text
    assert {
        e["output_index"] for e in ws.sent if e["type"] == "response.function_call_arguments.delta"
    } == {1}
    await send(
        conn,
        type="conversation.item.create",
        item={
            "type": "function_call_output",
            "call_id": call["call_id"],
            "output": '{"sky": "sunny"}',
        },
    )
    await send(conn, type="response.create")
    await until(lambda: types(ws).count("response.done") == 2)
    assert ws.sent[-1]["response"]["output"][0]["content"][0]["text"] == "It is sunny in Paris."
    assert engine.requests[-1].messages[-1].content == '{"sky": "sunny"}'
    if not beta:
        assert_ga(ws)


async def test_a_server_side_tool_is_answered_by_the_server_within_one_response():
    from tests.agent.test_session_tools import book_table
    from voicert.agent.toolbox import Toolbox, describe

    engine = FakeEngine(
        script=[
            '<tool_call>\n{"name": "book_table", "arguments": {"people": 2, '
            '"time": "20:00"}}\n</tool_call>',
            "Booked for two at eight.",
        ]
    )
    conn, ws, svc = await open_door(engine)
    svc.toolbox = Toolbox([describe(book_table)])
    await send(
        conn, type="session.update", session={"type": "realtime", "output_modalities": ["text"]}
    )
    await send(
        conn,
        type="conversation.item.create",
        item={
            "type": "message",
            "role": "user",
            "content": [{"type": "input_text", "text": "Book"}],
        },
    )
    await send(conn, type="response.create")
    await until(lambda: "response.done" in types(ws))
    outputs = [
        e["item"]
        for e in ws.sent
        if e["type"] == "conversation.item.added" and e["item"]["type"] == "function_call_output"
    ]
    assert len(outputs) == 1 and json.loads(outputs[0]["output"])["booked"] is True
    done = ws.sent[-1]["response"]
    assert [o["type"] for o in done["output"]] == ["function_call", "message"]
    assert done["output"][1]["content"][0]["text"] == "Booked for two at eight."
    assert_ga(ws)


async def test_tool_errors_are_shaped_as_the_api_shapes_them():
    conn, _ws, _ = await open_door()
    with pytest.raises(Exception) as bad_output:
        await send(
            conn,
            type="conversation.item.create",
            item={"type": "function_call_output", "call_id": "call_nope", "output": "x"},
        )
    assert bad_output.value.param == "item.call_id"
    with pytest.raises(Exception) as bad_tool:
        await send(
            conn,
            type="session.update",
            session={"tools": [{"type": "function", "name": "has space"}]},
        )
    assert bad_tool.value.param == "session.tools[0].name"
    with pytest.raises(Exception) as bad_choice:
        await send(
            conn,
            type="response.create",
            response={"tool_choice": {"type": "function", "name": "nope"}},
        )
    assert bad_choice.value.param == "response.tool_choice"


async def test_the_session_voice_is_one_the_server_offers_and_another_is_refused():
    from tests.speech.test_tts import ToneVoice
    from voicert.protocol.realtime import RealtimeError
    from voicert.speech.tts import PluginVoice, TtsWorker

    tts = TtsWorker(
        {"joe": PluginVoice(ToneVoice(None), "joe"), "anna": PluginVoice(ToneVoice(None), "anna")}
    )
    svc = Services(cfg=Config(), vad=EnergyVad(), asr=FakeAsr(), engine=FakeEngine(), tts=tts)
    try:
        ws = FakeWs()
        conn = RealtimeConnection(ws, svc)
        assert await conn.open()
        assert ws.sent[0]["session"]["audio"]["output"]["voice"] == "joe"  # the server's default
        await send(
            conn,
            type="session.update",
            session={"type": "realtime", "audio": {"output": {"voice": "anna"}}},
        )
        assert ws.sent[-1]["session"]["audio"]["output"]["voice"] == "anna"
        assert conn.session.voice == "anna"
        with pytest.raises(
            RealtimeError,
            match=r"'alloy' is not offered here \(offered: joe, "
            r"anna\)",
        ) as err:
            await send(
                conn,
                type="session.update",
                session={"type": "realtime", "audio": {"output": {"voice": "alloy"}}},
            )
        assert err.value.param == "session.voice" and conn.session.voice == "anna"
        assert_ga(ws)
    finally:
        tts.close()
    conn, ws, _ = await open_door()  # no speech output here: no voice to pick
    with pytest.raises(RealtimeError, match="offered: none"):
        await send(conn, type="session.update", session={"type": "realtime", "voice": "joe"})
