"""``/v1/realtime`` driven by the official ``openai`` SDK's realtime clients (GA and beta), with its
base URL pointed at the real server. Real models, real socket."""

from __future__ import annotations

import asyncio
import base64
import json

import numpy as np
import pytest
import soxr

from tests.conftest import heard_the_answer, wav
from voicert.audio.pcm import decode_pcm, encode_audio

openai = pytest.importorskip("openai")


def client(server):
    """The SDK pointed at this server (the beta client needs the WebSocket base URL spelled out:
    it would otherwise switch to wss://)."""
    return openai.AsyncOpenAI(
        api_key="unused",
        base_url=f"http://127.0.0.1:{server.port}/v1",
        websocket_base_url=f"ws://127.0.0.1:{server.port}/v1",
        max_retries=0,
    )


def kind(ev) -> str:
    return ev["type"] if isinstance(ev, dict) else ev.type


async def until(conn, wanted: str, seen: list | None = None, timeout: float = 120):
    """Read events until one of type ``wanted``; every event read goes into ``seen``."""

    async def read():
        while True:
            ev = await conn.recv()
            if seen is not None:
                seen.append(ev)
            if kind(ev) == wanted:
                return ev

    return await asyncio.wait_for(read(), timeout)


async def ask(conn, text: str):
    """A user text item, then a response to it: its ``response.done``."""
    await conn.conversation.item.create(
        item={"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}
    )
    await conn.response.create()
    return await until(conn, "response.done")


async def stream_speech(conn, name: str, rate: int, encoding: str, silence_s: float = 1.0):
    x, r = wav(name)
    x = np.concatenate(
        [soxr.resample(x, r, rate).astype(np.float32), np.zeros(int(rate * silence_s), np.float32)]
    )
    step = rate // 50  # 20 ms
    for i in range(0, x.size, step):
        chunk = encode_audio(x[i : i + step], encoding)
        await conn.input_audio_buffer.append(audio=base64.b64encode(chunk).decode())


async def test_ga_text_conversation(server):
    async with client(server).realtime.connect(model="voicert-smollm2") as conn:
        created = await until(conn, "session.created")
        assert created.session.model == "voicert-smollm2"
        await conn.session.update(
            session={
                "type": "realtime",
                "output_modalities": ["text"],
                "instructions": "You are a helpful voice assistant. Answer in one short sentence.",
            }
        )
        updated = await until(conn, "session.updated")
        assert updated.session.output_modalities == ["text"]
        await conn.conversation.item.create(
            item={
                "type": "message",
                "role": "user",
                "content": [{"type": "input_text", "text": "What is the capital of France?"}],
            }
        )
        added = await until(conn, "conversation.item.added")
        assert added.item.role == "user"
        await conn.response.create()
        seen: list = []
        done = await until(conn, "response.done", seen)
        kinds = [kind(e) for e in seen]
        assert kinds.index("response.created") < kinds.index("response.output_text.delta")
        deltas = "".join(e.delta for e in seen if kind(e) == "response.output_text.delta")
        text_done = next(e for e in seen if kind(e) == "response.output_text.done")
        assert "paris" in deltas.lower() and text_done.text == deltas.strip()
        assert done.response.status == "completed"
        assert done.response.output[0].content[0].text == text_done.text
        assert done.response.usage.output_tokens >= sum(
            1 for k in kinds if k.endswith("text.delta")
        )
        # the conversation carries on
        done = await ask(conn, "And what about Germany?")
        assert "berlin" in done.response.output[0].content[0].text.lower()


async def test_ga_speech_in_speech_out_with_server_vad(server, services):
    async with client(server).realtime.connect(model="voicert") as conn:
        await until(conn, "session.created")
        await conn.session.update(
            session={
                "type": "realtime",
                "output_modalities": ["audio"],
                "audio": {
                    "input": {
                        "format": {"type": "audio/pcm", "rate": 24000},
                        "turn_detection": {"type": "server_vad", "silence_duration_ms": 400},
                    },
                    "output": {"format": {"type": "audio/pcm", "rate": 24000}},
                },
            }
        )
        await until(conn, "session.updated")
        await stream_speech(conn, "capital_of_france", 24000, "pcm16")
        seen: list = []
        done = await until(conn, "response.done", seen)
        kinds = [kind(e) for e in seen]
        for k in (
            "input_audio_buffer.speech_started",
            "input_audio_buffer.speech_stopped",
            "input_audio_buffer.committed",
            "conversation.item.input_audio_transcription.completed",
            "response.created",
            "response.output_audio.delta",
            "response.output_audio_transcript.delta",
            "response.output_audio.done",
        ):
            assert k in kinds, (k, kinds)
        item_id = next(e for e in seen if kind(e) == "input_audio_buffer.committed").item_id
        transcript = next(
            e for e in seen if kind(e) == "conversation.item.input_audio_transcription.completed"
        )
        assert transcript.item_id == item_id and "france" in transcript.transcript.lower()
        audio = b"".join(
            base64.b64decode(e.delta) for e in seen if kind(e) == "response.output_audio.delta"
        )
        x24 = decode_pcm(audio, "pcm16")
        heard, _ = services.asr.model.transcribe(
            soxr.resample(x24, 24000, 16000).astype(np.float32), beam_size=1, language="en"
        )
        text = " ".join(s.text for s in heard)
        assert heard_the_answer(text), text
        said = "".join(e.delta for e in seen if kind(e) == "response.output_audio_transcript.delta")
        assert done.response.status == "completed"
        assert done.response.output[0].content[0].transcript == said.strip()


async def test_beta_client_mulaw_manual_commit_and_beta_event_names(server):
    async with client(server).beta.realtime.connect(model="voicert") as conn:
        await until(conn, "session.created")
        await conn.session.update(
            session={
                "modalities": ["text"],
                "turn_detection": None,
                "input_audio_format": "g711_ulaw",
            }
        )
        updated = await until(conn, "session.updated")
        assert updated.session.turn_detection is None
        await stream_speech(conn, "capital_of_france", 8000, "mulaw", silence_s=0.3)
        await conn.input_audio_buffer.commit()
        seen: list = []
        transcript = await until(
            conn, "conversation.item.input_audio_transcription.completed", seen
        )
        assert "capital" in transcript.transcript.lower()
        assert "input_audio_buffer.committed" in [kind(e) for e in seen]
        assert "conversation.item.created" in [kind(e) for e in seen]  # the beta name
        # manual mode: no response until the client asks for one
        with pytest.raises(asyncio.TimeoutError):
            await until(conn, "response.created", timeout=1.5)
        await conn.response.create()
        seen = []
        done = await until(conn, "response.done", seen)
        deltas = "".join(e.delta for e in seen if kind(e) == "response.text.delta")
        assert "paris" in deltas.lower() and done.response.status == "completed"


async def test_bad_events_get_error_events_and_the_session_goes_on(server):
    async with client(server).realtime.connect(model="voicert") as conn:
        await until(conn, "session.created")
        raw = conn.send_raw if hasattr(conn, "send_raw") else conn._connection.send

        async def error_for(payload: str) -> dict:
            await raw(payload)
            ev = await until(conn, "error", timeout=10)
            return ev.error

        err = await error_for(json.dumps({"type": "no.such.event", "event_id": "evt_1"}))
        assert err.type == "invalid_request_error" and err.param == "type"
        assert err.event_id == "evt_1" and "no.such.event" in err.message
        assert (await error_for("{not json")).code == "invalid_json"
        assert (
            await error_for(json.dumps({"type": "output_audio_buffer.clear"}))
        ).code == "unsupported_event"
        assert (
            await error_for(json.dumps({"type": "conversation.item.truncate"}))
        ).code == "missing_required_parameter"
        err = await error_for(
            json.dumps(
                {
                    "type": "session.update",
                    "session": {"tools": [{"type": "mcp", "server_label": "x"}]},
                }
            )
        )  # only function tools
        assert (err.code, err.param) == ("invalid_value", "session.tools[0].type")
        err = await error_for(json.dumps({"type": "session.update", "session": {"colour": 1}}))
        assert (err.code, err.param) == ("unknown_parameter", "session.colour")
        assert (
            await error_for(json.dumps({"type": "input_audio_buffer.commit"}))
        ).code == "input_audio_buffer_commit_empty"
        assert (
            await error_for(json.dumps({"type": "response.cancel"}))
        ).code == "response_cancel_not_active"
        assert (
            await error_for(json.dumps({"type": "input_audio_buffer.append", "audio": "!!"}))
        ).code == "invalid_value"
        assert (
            await error_for(
                json.dumps(
                    {
                        "type": "input_audio_buffer.append",
                        "audio": base64.b64encode(b"abc").decode(),
                    }
                )
            )
        ).code == "bad_audio"
        assert (
            await error_for(
                json.dumps({"type": "session.update", "session": {"input_audio_format": "opus"}})
            )
        ).param == "session.input_audio_format"
        await conn.input_audio_buffer.clear()
        await until(conn, "input_audio_buffer.cleared", timeout=10)
        # still a working session
        await conn.session.update(session={"type": "realtime", "output_modalities": ["text"]})
        await conn.conversation.item.create(
            item={
                "type": "message",
                "role": "user",
                "content": [{"type": "input_text", "text": "What is the capital of France?"}],
            }
        )
        await conn.response.create(response={"max_output_tokens": 3})
        done = await until(conn, "response.done")
        assert done.response.status == "incomplete"
        assert done.response.status_details.reason == "max_output_tokens"


async def test_response_cancel_mid_reply(server, services):
    async with client(server).realtime.connect(model="voicert") as conn:
        await until(conn, "session.created")
        await conn.session.update(session={"type": "realtime", "output_modalities": ["text"]})
        await conn.conversation.item.create(
            item={
                "type": "message",
                "role": "user",
                "content": [{"type": "input_text", "text": "Count from one to one hundred."}],
            }
        )
        await conn.response.create(response={"max_output_tokens": 400})
        await until(conn, "response.output_text.delta")
        await conn.response.cancel()
        done = await until(conn, "response.done")
        assert done.response.status == "cancelled"
        for _ in range(40):
            if not services.engine.live_requests():
                break
            await asyncio.sleep(0.05)
        assert not services.engine.live_requests()


async def recv_raw(conn, wanted: str, seen: list, timeout: float = 120) -> dict:
    """Read raw server events (JSON) until one of type ``wanted``; all go into ``seen``."""

    async def read():
        while True:
            ev = json.loads(await conn.recv_bytes())
            seen.append(ev)
            if ev["type"] == wanted:
                return ev

    return await asyncio.wait_for(read(), timeout)


def assert_ga_models(events: list[dict]) -> None:
    """Every server event validates against the official SDK's GA models, warnings as errors."""
    import warnings

    from openai.types.realtime import RealtimeServerEvent
    from pydantic import TypeAdapter

    adapter = TypeAdapter(RealtimeServerEvent)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for ev in events:
            adapter.validate_python(ev)


async def test_truncate_after_an_interruption_keeps_what_was_heard_and_delete_retrieve(server):
    seen: list = []
    async with client(server).realtime.connect(model="voicert") as conn:
        await recv_raw(conn, "session.created", seen)
        await conn.session.update(
            session={
                "type": "realtime",
                "output_modalities": ["audio"],
                "audio": {"input": {"turn_detection": None}},
            }
        )
        await recv_raw(conn, "session.updated", seen)
        await conn.conversation.item.create(
            item={
                "type": "message",
                "role": "user",
                "content": [{"type": "input_text", "text": "Count from one to forty in words."}],
            }
        )
        user = (await recv_raw(conn, "conversation.item.added", seen))["item"]
        await conn.response.create(response={"max_output_tokens": 200})
        assistant = (await recv_raw(conn, "response.output_item.added", seen))["item"]
        audio_ms, done = 0.0, None
        while audio_ms < 2500 and done is None:  # the listener interrupts after 2.5 s of it
            ev = json.loads(await asyncio.wait_for(conn.recv_bytes(), 120))
            seen.append(ev)
            if ev["type"] == "response.output_audio.delta":
                audio_ms += len(base64.b64decode(ev["delta"])) / 48  # pcm16, 24 kHz
            elif ev["type"] == "response.done":
                done = ev
        assert audio_ms > 500, "too little speech to truncate"
        cut_ms = int(audio_ms / 2)
        if done is None:
            await conn.response.cancel()
        await conn.conversation.item.truncate(
            item_id=assistant["id"], content_index=0, audio_end_ms=cut_ms
        )
        done = done or await recv_raw(conn, "response.done", seen)
        full = done["response"]["output"][0]["content"][0]["transcript"]
        truncated = await recv_raw(conn, "conversation.item.truncated", seen)
        assert (truncated["item_id"], truncated["audio_end_ms"]) == (assistant["id"], cut_ms)
        await conn.conversation.item.retrieve(item_id=assistant["id"])
        item = (await recv_raw(conn, "conversation.item.retrieved", seen))["item"]
        heard = item["content"][0]["transcript"]
        assert item["content"][0]["type"] == "output_audio"
        assert full.startswith(heard) and 0 < len(heard) < len(full), (heard, full)
        # errors, shaped as the API shapes them
        await conn.conversation.item.truncate(
            item_id=assistant["id"], content_index=0, audio_end_ms=10**7
        )
        err = (await recv_raw(conn, "error", seen))["error"]
        assert err["param"] == "audio_end_ms" and "already shorter" in err["message"]
        await conn.conversation.item.truncate(item_id=user["id"], content_index=0, audio_end_ms=0)
        assert (await recv_raw(conn, "error", seen))["error"]["param"] == "item_id"
        # delete, then the item is gone
        await conn.conversation.item.delete(item_id=user["id"])
        assert (await recv_raw(conn, "conversation.item.deleted", seen))["item_id"] == user["id"]
        for _ in range(2):
            await conn.conversation.item.retrieve(item_id=user["id"])
            assert "not found" in (await recv_raw(conn, "error", seen))["error"]["message"]
            await conn.conversation.item.delete(item_id=user["id"])
        # a text reply too: its item's content is output_text (GA)
        await conn.session.update(session={"type": "realtime", "output_modalities": ["text"]})
        await conn.response.create(response={"max_output_tokens": 8})
        done = await recv_raw(conn, "response.done", seen)
        assert done["response"]["output"][0]["content"][0]["type"] == "output_text"
    assert_ga_models(seen)


BOOK = {
    "type": "function",
    "name": "book_table",
    "description": "Book a restaurant table",
    "parameters": {
        "type": "object",
        "additionalProperties": False,
        "required": ["people", "time"],
        "properties": {
            "people": {"type": "integer", "minimum": 1, "maximum": 12},
            "time": {"type": "string", "maxLength": 8},
        },
    },
}


@pytest.mark.parametrize("beta", [False, True])
async def test_a_forced_tool_choice_gives_a_schema_valid_call_whose_output_is_used(server, beta):
    """The official SDK (GA and beta): a named tool_choice makes the embedded model call the tool
    with arguments valid against its schema; the client's function_call_output joins the
    conversation and the next response is made from it."""
    import jsonschema

    sdk = client(server)
    connect = sdk.beta.realtime.connect if beta else sdk.realtime.connect
    async with connect(model="voicert") as conn:
        await until(conn, "session.created")
        session = (
            {"modalities": ["text"], "tools": [BOOK]}
            if beta
            else {"type": "realtime", "output_modalities": ["text"], "tools": [BOOK]}
        )
        await conn.session.update(session=session)
        await until(conn, "session.updated")
        await conn.conversation.item.create(
            item={
                "type": "message",
                "role": "user",
                "content": [{"type": "input_text", "text": "A table for four at 7pm, please."}],
            }
        )
        await conn.response.create(
            response={"tool_choice": {"type": "function", "name": "book_table"}}
        )
        seen: list = []
        done = await until(conn, "response.done", seen)
        calls = [o for o in done.response.output if o.type == "function_call"]
        assert len(calls) == 1 and calls[0].name == "book_table"
        jsonschema.validate(json.loads(calls[0].arguments), BOOK["parameters"])
        deltas = "".join(
            e.delta for e in seen if kind(e) == "response.function_call_arguments.delta"
        )
        assert deltas == calls[0].arguments
        await conn.conversation.item.create(
            item={
                "type": "function_call_output",
                "call_id": calls[0].call_id,
                "output": json.dumps({"booked": True, "table": 12}),
            }
        )
        await conn.response.create()
        done = await until(conn, "response.done")
        assert done.response.status in ("completed", "incomplete")
        message = [o for o in done.response.output if o.type == "message"]
        assert message and message[0].content[0].text  # it answered in words


async def test_a_responses_own_tools_are_offered_for_that_response_only(server):
    """``response.tools`` (GA): tools given with one response.create are that reply's, in place of
    the session's (none here); the next response does not have them."""
    async with client(server).realtime.connect(model="voicert") as conn:
        await until(conn, "session.created")
        await conn.session.update(session={"type": "realtime", "output_modalities": ["text"]})
        await until(conn, "session.updated")
        await conn.conversation.item.create(
            item={
                "type": "message",
                "role": "user",
                "content": [{"type": "input_text", "text": "A table for two at 8pm, please."}],
            }
        )
        await conn.response.create(
            response={"tools": [BOOK], "tool_choice": {"type": "function", "name": "book_table"}}
        )
        done = await until(conn, "response.done")
        calls = [o for o in done.response.output if o.type == "function_call"]
        assert len(calls) == 1 and calls[0].name == "book_table"
        await conn.response.create(
            response={"tool_choice": {"type": "function", "name": "book_table"}}
        )
        error = await until(conn, "error")
        assert error.error.param == "response.tool_choice"
        await conn.response.create(response={"tools": [{"type": "function", "name": 7}]})
        assert (await until(conn, "error")).error.param.startswith("response.tools")


async def test_the_sdk_with_a_temperature_gets_sampled_answers(server):
    """The beta SDK's session.temperature (0.7) is served, not refused or ignored: four sessions
    asked the same open question draw different replies, where two greedy ones (0) agree word for
    word. (Realtime has no seed; 24 sampled tokens from the embedded model repeat themselves four
    times with a chance far below one in a million: a draw that matched would be a bug.)"""

    async def reply(temperature: float) -> str:
        async with client(server).beta.realtime.connect(model="voicert") as conn:
            await until(conn, "session.created")
            await conn.session.update(
                session={
                    "modalities": ["text"],
                    "temperature": temperature,
                    "max_response_output_tokens": 24,
                }
            )
            updated = await until(conn, "session.updated")
            assert updated.session.temperature == temperature
            done = await ask(conn, "Tell me a story about a cat.")
            return done.response.output[0].content[0].text

    greedy = [await reply(0) for _ in range(2)]
    assert greedy[0] == greedy[1] and greedy[0]
    sampled = [await reply(0.7) for _ in range(4)]
    assert all(sampled) and len(set(sampled)) >= 2, sampled


async def test_a_second_response_create_while_one_runs_is_openais_error(server):
    """Two response.create in one burst: the first is answered, the second gets OpenAI's
    ``conversation_already_has_active_response`` (it was dropped in silence)."""
    async with client(server).realtime.connect(model="voicert") as conn:
        await conn.conversation.item.create(
            item={
                "type": "message",
                "role": "user",
                "content": [{"type": "input_text", "text": "Count from one to twenty."}],
            }
        )
        await conn.response.create()
        await conn.response.create()
        seen: list = []
        await until(conn, "response.done", seen)
        errors = [ev for ev in seen if kind(ev) == "error"]
        assert [e.error.code for e in errors] == ["conversation_already_has_active_response"]
        assert sum(kind(ev) == "response.created" for ev in seen) == 1
        done = await ask(conn, "And now?")  # the conversation goes on
        assert done.response.status in ("completed", "incomplete")  # (incomplete: the length)
