"""``POST /v1/chat/completions`` and ``GET /v1/models``: this server's engine for any OpenAI client
(whole responses and server-sent-event streams, usage, bearer auth as the WebSocket routes).

The requests share the engine (and its prefix cache and batches) with the voice sessions; at most
``server.max_completions`` run at once, more get 429. A client that goes away mid-stream cancels its
request in the engine. The wire shapes are built in ``voicert/protocol/chat.py``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import http
import itertools
import logging
import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from pathlib import Path

from voicert.agent import tool_calls as tc
from voicert.agent.session import Services
from voicert.config import Config
from voicert.core.chat import ToolCall
from voicert.core.llm import (
    BAD_REQUEST,
    FinishReason,
    GenerationRequest,
    TokenEvent,
    final_event,
    is_bad_request,
)
from voicert.protocol import chat
from voicert.server import access, offloop
from voicert.server.http import HttpRequest, HttpResponse, json_response

log = logging.getLogger(__name__)
CHAT_PATH = "/v1/chat/completions"
MODELS_PATH = "/v1/models"
EMBEDDED_MODEL_ID = "smollm2-135m-instruct"


def served_model_id(cfg: Config) -> str:
    """The model id clients name: over ``llm.engine: openai`` the upstream's (``llm.model``, as
    resolved at start-up); else from ``models.llm``: the embedded model's name, or the file or
    directory name without a ``.gguf`` suffix."""
    if cfg.llm.engine == "openai":
        return cfg.llm.model
    llm_setting = cfg.models.llm
    if llm_setting == "embedded":
        return EMBEDDED_MODEL_ID
    name = Path(llm_setting.rstrip("/")).name
    return name[:-5] if name.endswith(".gguf") else name


def _error(exc: chat.ChatError, headers: list[tuple[str, str]] | None = None) -> HttpResponse:
    response = json_response(exc.status, exc.body())
    response.headers.extend(headers or [])
    return response


_ENDED = object()  # on a completion's event queue: shutdown ended it (ChatCompletions.end_all)


class ChatCompletions:
    """The two routes. ``services`` returns the loaded services (None while loading);
    ``unready_reason`` says why new work is refused now (loading, draining, a part down), or None
    when it is taken."""

    def __init__(
        self, services: Callable[[], Services | None], unready_reason: Callable[[], str | None]
    ) -> None:
        self._services = services
        self._unready_reason = unready_reason
        self.running = 0
        # the completions running: their engine, and the queue their engine events arrive on
        self._open: dict[str, tuple[Services, asyncio.Queue]] = {}
        self.stopping = False  # shutdown: the requests still running are ended
        self._ids = itertools.count(1)
        self._started = int(time.time())

    # ------------------------------------------------------------ routes

    async def models(self, request: HttpRequest) -> HttpResponse:
        svc = self._services()
        refusal = self._check(request, svc)
        if refusal is not None:
            return refusal
        assert svc is not None  # _check refuses (503) until the services are loaded
        return json_response(
            http.HTTPStatus.OK, chat.models_list(served_model_id(svc.cfg), self._started)
        )

    async def completions(self, request: HttpRequest) -> HttpResponse:
        svc = self._services()
        refusal = self._check(request, svc)
        if refusal is not None:
            return refusal
        assert svc is not None  # _check refuses (503) until the services are loaded
        cfg = svc.cfg
        try:
            req = await offloop.decode(chat.parse_request, request.body, cfg.server.max_text_chars)
            model = served_model_id(cfg)
            if req.model != model:
                raise chat.ChatError(
                    404,
                    f"model {req.model!r} is not served here (this "
                    f"server serves {model!r}; see GET {MODELS_PATH})",
                    "model",
                    "model_not_found",
                )
            max_new = req.max_tokens or max(cfg.llm.max_context_tokens // 4, 1)
            if max_new >= cfg.llm.max_context_tokens:
                raise chat.ChatError(
                    400,
                    f"max_tokens must be below the context length ({cfg.llm.max_context_tokens})",
                    "max_tokens",
                )
        except chat.ChatError as exc:
            return _error(exc)
        if cfg.server.max_completions == 0:
            return _error(
                chat.ChatError(
                    403,
                    "chat completions are off here (server.max_completions: 0)",
                    None,
                    "disabled",
                    "permission_error",
                )
            )
        if self.running >= cfg.server.max_completions:
            return _error(
                chat.ChatError(
                    429,
                    f"{self.running} completions running (the limit, "
                    f"server.max_completions); retry shortly",
                    None,
                    "rate_limit_exceeded",
                    "rate_limit_error",
                ),
                [("Retry-After", "1")],
            )
        engine_req = GenerationRequest(
            f"http-{next(self._ids)}-{req.id}",
            list(req.messages),
            max_new,
            session_id="http",
            tools=req.tools,
            tool_choice=req.tool_choice,
            parallel_tool_calls=req.parallel_tool_calls,
            sampling=req.sampling,
        )
        if req.stream:
            return HttpResponse(
                http.HTTPStatus.OK,
                content_type="text/event-stream",
                stream=self._stream(svc, req, engine_req, model),
            )
        return await self._whole(svc, req, engine_req, model)

    def _check(self, request: HttpRequest, svc: Services | None) -> HttpResponse | None:
        """Loading, draining, access: the refusals every route here shares."""
        why = self._unready_reason()
        if svc is None or why is not None:
            why = why or "loading models"
            return _error(
                chat.ChatError(503, why, code="unavailable", kind="server_error"),
                [("Retry-After", "1")],
            )
        s = svc.cfg.server
        refusal = access.check(
            request.path,
            request.header("Authorization"),
            request.header("Origin"),
            access.split_list(s.auth_tokens),
            access.split_list(s.allowed_origins),
            request.header("Host"),
        )
        if refusal is None:
            return None
        log.info("refused %s: %s", request.path, refusal.reason)
        kind = "authentication_error" if refusal.status == 401 else "permission_error"
        return _error(
            chat.ChatError(refusal.status, refusal.reason, None, None, kind), list(refusal.headers)
        )

    # ------------------------------------------------------------ generating

    async def _tokens(
        self, svc: Services, engine_req: GenerationRequest, stops: chat.StopMatcher
    ) -> AsyncGenerator[tuple[str, TokenEvent]]:
        """(text to send, event) per engine event; cancels the request in the engine when a stop
        string ends it early or the consumer goes away. The engine's events arrive through a
        queue (:meth:`_pump`), so that :meth:`end_all` can end the completion at once."""
        self.running += 1
        request_id = engine_req.request_id
        events: asyncio.Queue = asyncio.Queue()
        self._open[request_id] = (svc, events)
        pump = asyncio.ensure_future(self._pump(svc, engine_req, events))
        done = False
        try:
            while True:
                ev = await events.get()
                if isinstance(ev, BaseException):  # the engine's stream raised
                    raise ev
                if ev is _ENDED:  # shutdown: the engine's acknowledgement is not waited for
                    done = True
                    yield stops.flush(), final_event(FinishReason.CANCELLED)
                    return
                if ev.finish_reason is not None:
                    done = True
                    yield stops.flush(), ev
                    return
                piece, hit = stops.push(ev.text)
                if hit:
                    svc.engine.cancel(request_id)
                    done = True
                    yield (
                        piece,
                        TokenEvent(
                            ev.index + 1,
                            -1,
                            "",
                            ev.sampled_ns,
                            ev.prefill_start_ns,
                            ev.prompt_tokens,
                            FinishReason.STOP,
                        ),
                    )
                    return
                yield piece, ev
        finally:
            self.running -= 1
            self._open.pop(request_id, None)
            if not done:
                svc.engine.cancel(request_id)
            pump.cancel()  # (a no-op once the engine's stream has ended)

    @staticmethod
    async def _pump(svc: Services, engine_req: GenerationRequest, events: asyncio.Queue) -> None:
        """The engine's events for one request onto ``events``, up to its last; an exception
        the engine's stream raises goes onto it too, for the consumer to raise."""
        try:
            async for ev in svc.engine.submit(engine_req):
                events.put_nowait(ev)
                if ev.finish_reason is not None:
                    return
        except Exception as e:  # handed to the consumer, which raises it
            events.put_nowait(e)

    def _failure(self, ev: TokenEvent) -> chat.ChatError:
        """What a completion the engine ended (an error, or shutdown's cancel) answers."""
        if self.stopping and ev.finish_reason == FinishReason.CANCELLED:
            return chat.ChatError(
                503, "server shutting down", code="unavailable", kind="server_error"
            )
        if is_bad_request(ev.error):  # the request's own fault (its tool schema): a 400
            assert ev.error is not None
            why = ev.error.removeprefix(BAD_REQUEST)
            return chat.ChatError(400, why, "tools" if "tool schema" in why else None)
        return chat.ChatError(
            503,
            f"generation failed: {ev.error or ev.finish_reason}",
            code="engine_error",
            kind="server_error",
        )

    def end_all(self) -> None:
        """Shutdown, after the grace period: end the completions still running, at once. Each
        stream closes with an error event and ``[DONE]``, and each whole answer is a 503, rather
        than the socket being cut mid-reply; their engine requests are cancelled, and the end
        does not wait for the engine to say so (a busy or stuck engine cannot hold it)."""
        self.stopping = True
        for request_id, (svc, events) in list(self._open.items()):
            svc.engine.cancel(request_id)
            events.put_nowait(_ENDED)

    async def _whole(
        self, svc: Services, req: chat.ChatRequest, engine_req: GenerationRequest, model: str
    ) -> HttpResponse:
        stops = chat.StopMatcher(req.stop)
        calls = _Calls(bool(req.tools))
        tokens = self._tokens(svc, engine_req, stops)
        try:
            async for piece, ev in tokens:
                calls.feed(piece)
                if ev.finish_reason is not None:
                    break
                if calls.repeats.looping:  # repeating its calls: the reply is complete
                    ev = dataclasses.replace(
                        ev, index=ev.index + 1, finish_reason=FinishReason.STOP
                    )
                    break
        finally:
            await tokens.aclose()
        calls.close()
        if ev.finish_reason == FinishReason.ERROR or ev.finish_reason == FinishReason.CANCELLED:
            return _error(self._failure(ev))
        return json_response(
            http.HTTPStatus.OK,
            chat.completion(
                req,
                model,
                calls.text.strip() if req.tools else calls.text,
                chat.finish_reason(ev.finish_reason or FinishReason.STOP, bool(calls.done)),
                ev.prompt_tokens,
                ev.index,
                tuple(calls.done),
            ),
        )

    async def _stream(
        self, svc: Services, req: chat.ChatRequest, engine_req: GenerationRequest, model: str
    ) -> AsyncIterator[bytes]:
        stops = chat.StopMatcher(req.stop)
        yield chat.sse(chat.chunk(req, model, {"role": "assistant", "content": ""}))
        tokens = self._tokens(svc, engine_req, stops)
        calls = _Calls(bool(req.tools))
        try:
            async for piece, ev in tokens:
                for delta in calls.feed(piece) if piece else []:
                    yield chat.sse(chat.chunk(req, model, delta))
                if ev.finish_reason is None and calls.repeats.looping:
                    ev = dataclasses.replace(
                        ev, index=ev.index + 1, finish_reason=FinishReason.STOP
                    )
                if ev.finish_reason is None:
                    continue
                for delta in calls.close():
                    yield chat.sse(chat.chunk(req, model, delta))
                if ev.finish_reason in (FinishReason.ERROR, FinishReason.CANCELLED):
                    yield chat.sse(self._failure(ev).body())
                    yield chat.sse("[DONE]")  # the stream ends as a stream: no transport error
                    return
                yield chat.sse(
                    chat.chunk(
                        req, model, reason=chat.finish_reason(ev.finish_reason, bool(calls.done))
                    )
                )
                if req.include_usage:
                    yield chat.sse(
                        chat.chunk(req, model, usage_=chat.usage(ev.prompt_tokens, ev.index))
                    )
                yield chat.sse("[DONE]")
                return
        finally:
            await tokens.aclose()


class _Calls:
    """A completion's text as stream deltas: content, and (when tools were offered) each call as
    ``tool_calls`` deltas, its id and name first, then its arguments as they are decoded."""

    def __init__(self, tools: bool) -> None:
        self.parser = tc.CallParser() if tools else None
        self.repeats = tc.RepeatFilter()  # (small models repeat a call until the length limit)
        self.text = ""
        self.done: list[ToolCall] = []
        self._ids: dict[int, str] = {}

    def feed(self, piece: str) -> list[dict]:
        if self.parser is None:
            self.text += piece
            return [{"content": piece}] if piece else []
        return self._deltas(self.parser.feed(piece))

    def close(self) -> list[dict]:
        return self._deltas(self.parser.close()) if self.parser is not None else []

    def _deltas(self, pieces: list) -> list[dict]:
        out: list[dict] = []
        for p in self.repeats.push(pieces):
            if isinstance(p, tc.Said):
                self.text += p.text
                out.append({"content": p.text})
            elif isinstance(p, tc.CallOpened):
                self._ids[p.index] = f"call_{uuid.uuid4().hex[:24]}"
                out.append(
                    {
                        "tool_calls": [
                            {
                                "index": p.index,
                                "id": self._ids[p.index],
                                "type": "function",
                                "function": {"name": p.name, "arguments": ""},
                            }
                        ]
                    }
                )
            elif isinstance(p, tc.CallArgs):
                out.append({"tool_calls": [{"index": p.index, "function": {"arguments": p.delta}}]})
            elif isinstance(p, tc.CallClosed):
                self.done.append(ToolCall(self._ids[p.index], p.name, p.arguments))
        return out
