"""The LLM stage as a client of an OpenAI-compatible server (engine/clients/openai_compat.py), against a
scripted server on a real socket: streaming, cancel closes the stream, retries before the first
token, timeouts, refusals, start-up model checks. No test depends on how fast the machine is:
a timeout is only ever tested against a server that never answers."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from typing import ClassVar

import pytest

from voicert.config import ConfigError, LlmConfig
from voicert.core.chat import ChatMessage
from voicert.core.llm import GenerationRequest
from voicert.engine.clients.openai_compat import OpenAICompatEngine, resolve_model


def sse(obj) -> bytes:
    return f"data: {obj if isinstance(obj, str) else json.dumps(obj)}\n\n".encode()


def delta(text=None, finish=None):
    return {
        "id": "x",
        "object": "chat.completion.chunk",
        "model": "m",
        "choices": [
            {
                "index": 0,
                "delta": {} if text is None else {"content": text},
                "finish_reason": finish,
            }
        ],
    }


STREAM_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n"


class Upstream:
    """A scripted chat completions server. ``script`` holds one behaviour per request (an async
    function of (writer, body)); when it runs out, ``default`` answers."""

    def __init__(self) -> None:
        self.bodies: list[dict] = []
        self.script: list = []
        self.default = self.reply(["Hello", " there."])
        self.disconnected = asyncio.Event()
        self.server: asyncio.Server | None = None

    async def __aenter__(self) -> Upstream:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return self

    async def __aexit__(self, *exc) -> None:
        self.server.close()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}/v1"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            length = 0
            for line in head.decode().split("\r\n"):
                if line.lower().startswith("content-length:"):
                    length = int(line.split(":")[1])
            path = head.split(b" ")[1].decode()
            body = json.loads(await reader.readexactly(length)) if length else {}
            if path.endswith("/models"):
                await self._json(
                    writer,
                    200,
                    {"object": "list", "data": [{"id": m, "object": "model"} for m in self.models]},
                )
                return
            self.bodies.append(body)
            behaviour = self.script.pop(0) if self.script else self.default
            await behaviour(writer, body)
            if not reader.at_eof():  # hold the connection until the client lets it go
                await reader.read()
            self.disconnected.set()
        except (ConnectionError, asyncio.IncompleteReadError):
            self.disconnected.set()
        finally:
            writer.close()

    models: ClassVar[list[str]] = ["m"]

    @staticmethod
    async def _json(writer, status: int, obj) -> None:
        data = json.dumps(obj).encode()
        writer.write(
            f"HTTP/1.1 {status} X\r\nContent-Type: application/json\r\nContent-Length: "
            f"{len(data)}\r\nConnection: close\r\n\r\n".encode()
            + data
        )
        await writer.drain()

    def reply(self, pieces, usage=(7, 2)):
        async def go(writer, body):
            writer.write(STREAM_HEAD)
            for p in pieces:
                writer.write(sse(delta(p)))
            writer.write(sse(delta(finish="stop")))
            writer.write(
                sse(
                    {
                        "id": "x",
                        "object": "chat.completion.chunk",
                        "choices": [],
                        "usage": {
                            "prompt_tokens": usage[0],
                            "completion_tokens": usage[1],
                            "total_tokens": sum(usage),
                        },
                    }
                )
            )
            writer.write(sse("[DONE]"))
            await writer.drain()
            writer.close()

        return go

    def status(self, code: int, message="no"):
        async def go(writer, body):
            await self._json(writer, code, {"error": {"message": message, "type": "x"}})
            writer.close()

        return go

    def hang(self, first=None):
        """Headers (and ``first`` tokens), then nothing, ever."""

        async def go(writer, body):
            writer.write(STREAM_HEAD)
            for p in first or ():
                writer.write(sse(delta(p)))
            await writer.drain()

        return go


def engine_for(up: Upstream, **kw) -> OpenAICompatEngine:
    cfg = LlmConfig(engine="openai", base_url=up.url, model="m", **kw)
    return OpenAICompatEngine(cfg, "m")


def request(rid="r1", text="Hi", **kw) -> GenerationRequest:
    return GenerationRequest(
        rid, [ChatMessage("system", "Be brief."), ChatMessage("user", text)], 32, **kw
    )


async def collect(stream):
    return [ev async for ev in stream]


async def test_a_streamed_reply_arrives_token_by_token_with_usage():
    async with Upstream() as up:
        engine = engine_for(up, extra={"temperature": 0.6, "top_k": 20})
        events = await collect(engine.submit(request()))
        assert "".join(e.text for e in events) == "Hello there."
        assert [e.index for e in events] == [0, 1, 2]
        final = events[-1]
        assert final.finish_reason == "stop" and final.error is None and final.prompt_tokens == 7
        assert events[0].sampled_ns >= events[0].prefill_start_ns > 0
        body = up.bodies[0]
        assert body["model"] == "m" and body["max_tokens"] == 32 and body["stream"] is True
        assert body["temperature"] == 0.6 and body["top_k"] == 20
        assert body["messages"][1] == {"role": "user", "content": "Hi"}
        assert engine.stats().finished == 1 and not engine.live_requests()
        engine.close()


async def test_cancel_closes_the_stream_so_the_server_stops():
    async with Upstream() as up:
        up.script = [up.hang(["One", " two"])]
        engine = engine_for(up)
        stream = engine.submit(request())
        first = await stream.__anext__()
        assert first.text == "One"
        engine.cancel("r1")
        rest = await collect(stream)
        assert rest[-1].finish_reason == "cancelled"
        await asyncio.wait_for(up.disconnected.wait(), 30)  # the server saw its client go
        assert not engine.live_requests() and engine.stats().cancelled == 1
        engine.close()


async def test_a_cancel_right_after_submit_still_ends_the_stream():
    engine = OpenAICompatEngine(LlmConfig(engine="openai", base_url="http://127.0.0.1:9/v1"), "m")
    stream = engine.submit(request())
    engine.cancel("r1")  # before its task has run at all
    # (a guard, not a timing: without the fix this stream never ends)
    assert (await asyncio.wait_for(collect(stream), 60))[-1].finish_reason == "cancelled"
    assert not engine.live_requests() and engine.stats().cancelled == 1


async def test_failures_before_the_first_token_are_retried():
    async with Upstream() as up:
        up.script = [up.status(503, "warming up"), up.status(429, "busy")]
        engine = engine_for(up, retries=2)
        events = await collect(engine.submit(request()))
        assert events[-1].finish_reason == "stop" and len(up.bodies) == 3
        assert "".join(e.text for e in events) == "Hello there."
        engine.close()


async def test_a_refusal_is_not_retried_and_names_the_status():
    async with Upstream() as up:
        up.script = [up.status(401, "bad key")]
        engine = engine_for(up, retries=2)
        final = (await collect(engine.submit(request())))[-1]
        assert final.finish_reason == "error" and len(up.bodies) == 1
        assert "HTTP 401" in final.error and "bad key" in final.error
        engine.close()


async def test_a_server_that_is_down_gives_a_typed_error_after_bounded_retries():
    async with Upstream() as up:
        url = up.url
    engine = OpenAICompatEngine(
        LlmConfig(engine="openai", base_url=url, retries=1, first_token_timeout_s=60), "m"
    )
    final = (await collect(engine.submit(request())))[-1]
    assert final.finish_reason == "error"
    assert "unavailable" in final.error and "after 2 attempts" in final.error
    assert not engine.live_requests()
    engine.close()


async def test_no_first_token_in_time_is_an_error():
    async with Upstream() as up:
        up.script = [up.hang()]
        engine = engine_for(up, first_token_timeout_s=0.2)
        final = (await collect(engine.submit(request())))[-1]
        assert final.finish_reason == "error" and "no token within 0.2 s" in final.error
        engine.close()


async def test_a_stream_that_stalls_after_its_first_token_ends_with_what_it_sent():
    async with Upstream() as up:
        up.script = [up.hang(["Partial"])]
        engine = engine_for(up, stall_timeout_s=0.2)
        events = await collect(engine.submit(request()))
        assert events[0].text == "Partial"
        assert events[-1].finish_reason == "error" and "stalled" in events[-1].error
        assert len(up.bodies) == 1  # never retried once the reply has begun
        engine.close()


async def test_a_length_cut_reply_says_length():
    async with Upstream() as up:

        async def cut(writer, body):
            writer.write(
                STREAM_HEAD + sse(delta("a")) + sse(delta(finish="length")) + sse("[DONE]")
            )
            await writer.drain()
            writer.close()

        up.script = [cut]
        engine = engine_for(up)
        assert (await collect(engine.submit(request())))[-1].finish_reason == "length"
        engine.close()


async def test_requests_the_engine_cannot_take_end_at_once():
    engine = OpenAICompatEngine(LlmConfig(engine="openai", base_url="http://127.0.0.1:9/v1"), "m")
    bad = dataclasses.replace(request(), max_new_tokens=0)
    assert (await collect(engine.submit(bad)))[-1].finish_reason == "error"
    ids = GenerationRequest("r2", [], 4, prompt_ids=[1, 2])
    final = (await collect(engine.submit(ids)))[-1]
    assert final.finish_reason == "error" and "prompt_ids" in final.error


async def test_start_up_resolves_the_model_or_names_the_key():
    async with Upstream() as up:
        cfg = LlmConfig(engine="openai", base_url=up.url)
        assert await asyncio.to_thread(resolve_model, cfg) == "m"
        with pytest.raises(ConfigError, match="llm.model: 'gpt' is not served"):
            await asyncio.to_thread(resolve_model, dataclasses.replace(cfg, model="gpt"))
        up.models = ["a", "b"]
        with pytest.raises(ConfigError, match="llm.model: not set.*serves a, b"):
            await asyncio.to_thread(resolve_model, cfg)
        url = up.url
    down = LlmConfig(engine="openai", base_url=url, connect_timeout_s=5)
    assert await asyncio.to_thread(resolve_model, dataclasses.replace(down, model="x")) == "x"
    with pytest.raises(ConfigError, match="llm.model: not set"):
        await asyncio.to_thread(resolve_model, down)


def test_config_checks_the_remote_keys():
    with pytest.raises(ConfigError, match="llm.base_url"):
        LlmConfig(engine="openai")
    with pytest.raises(ConfigError, match="llm.extra"):
        LlmConfig(engine="openai", base_url="http://x/v1", extra={"stream": False})
