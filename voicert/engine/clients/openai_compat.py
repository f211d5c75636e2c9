"""The LLM stage as a client of an OpenAI-compatible server (``llm.engine: openai``): vLLM, SGLang,
llama.cpp's server, a router in front of replicas, another voicert's ``/v1/chat/completions``.

:class:`OpenAICompatEngine` implements the :class:`~voicert.core.llm.Engine` interface, so the
session, the tools loop and every door are the same as over the built-in engine:

- ``submit`` starts a streamed request at once (a task on the caller's event loop); each chunk
  that adds text becomes a TokenEvent. A tool call comes back in the HERMES text form the agent's
  call parser reads (``engine/clients/chat_upstream.py``).
- ``cancel`` (a barge-in, a disconnect) closes the HTTP stream: the server sees its client go away
  and stops generating; the stream here ends ``cancelled``.
- Failures before the first token (connection refused or reset, HTTP 408/409/429/5xx, a stream
  that ends empty) are retried up to ``llm.retries`` times, all within ``llm.first_token_timeout_s``
  from the request; after the first token a stream silent for ``llm.stall_timeout_s`` or broken ends
  the reply. Either way the stream ends with ``finish_reason='error'`` and an error that names the
  server and what happened: the session reports it (a typed error) and speaks its apology, and it
  goes on serving.

Latency points: ``prefill_start_ns`` is when the attempt that answered was sent, ``sampled_ns``
when its chunk arrived here (the server's own timings are not on the wire), so the ``prefill``
stage is the server's queue, prefill and the network together.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

from voicert.config import ConfigError
from voicert.core.llm import (
    EndedStream,
    EngineBase,
    EngineStats,
    FinishReason,
    GenerationRequest,
    TokenEvent,
    final_event,
    refusal,
    unscored,
)
from voicert.engine.base import RequestLedger
from voicert.engine.clients.chat_upstream import (
    StreamReader,
    UpstreamError,
    fit_messages,
    request_body,
    sse_data,
)
from voicert.engine.clients.stream import TokenStream

if TYPE_CHECKING:
    from voicert.config import LlmConfig

log = logging.getLogger(__name__)
RETRY_STATUS = {408, 409, 429, 500, 502, 503, 504}
BACKOFF_S = 0.1  # before the first retry; doubles per attempt
CHARS_PER_TOKEN = 3  # the remote tokenizer is unknown: context is budgeted in characters
_FINISH = {"length": FinishReason.LENGTH}  # stop, tool_calls, content_filter...: the reply ended


class _Retry(Exception):
    """An attempt failed before its first token in a way another attempt may not."""


class _Failed(Exception):
    """The request failed; the message says how (for the caller)."""


def api_key(cfg: LlmConfig) -> str:
    """``llm.api_key``, else ``$VOICERT_LLM_API_KEY``, else ``$OPENAI_API_KEY``, else a placeholder
    (servers without auth ignore it; the SDK insists on one)."""
    return (
        cfg.api_key
        or os.environ.get("VOICERT_LLM_API_KEY")
        or os.environ.get("OPENAI_API_KEY")
        or "none"
    )


def resolve_model(cfg: LlmConfig) -> str:
    """The model to ask for: ``llm.model`` checked against the server's ``GET /models``, or the
    server's only model when unset. Blocking (start-up). Raises ConfigError naming the key when the
    server does not serve it; a server that cannot be reached now is logged, not fatal, when the
    model is named (replies fail with a typed error until it is up)."""
    import openai

    client = openai.OpenAI(
        base_url=cfg.base_url,
        api_key=api_key(cfg),
        max_retries=0,
        timeout=openai.Timeout(cfg.connect_timeout_s * 2, connect=cfg.connect_timeout_s),
    )
    try:
        served = [m.id for m in client.models.list().data]
    except openai.AuthenticationError as exc:
        raise ConfigError(f"llm.api_key: {cfg.base_url} refused it ({exc.status_code})") from None
    except openai.OpenAIError as exc:
        if not cfg.model:
            raise ConfigError(
                f"llm.model: not set, and {cfg.base_url} could not be asked which "
                f"models it serves ({type(exc).__name__}: {exc})"
            ) from None
        log.warning(
            "llm: %s is not reachable now (%s); replies fail until it is", cfg.base_url, exc
        )
        return cfg.model
    finally:
        client.close()
    if cfg.model and cfg.model in served:
        return cfg.model
    listed = ", ".join(served[:10]) or "nothing"
    if cfg.model:
        raise ConfigError(
            f"llm.model: {cfg.model!r} is not served by {cfg.base_url} (it serves {listed})"
        )
    if len(served) != 1:
        raise ConfigError(f"llm.model: not set, and {cfg.base_url} serves {listed}: name one")
    return served[0]


class OpenAICompatEngine(EngineBase):
    """The :class:`~voicert.core.llm.Engine` contract over HTTP. ``submit`` and ``cancel`` are
    called on one event loop (the server's); the HTTP client is made on it at the first request.
    It has no failure of its own (``state`` stays SERVING): each request fails alone."""

    def __init__(self, cfg: LlmConfig, model: str) -> None:
        self.cfg = cfg
        self.model = model
        self._ledger = RequestLedger()
        self._tasks: dict[str, asyncio.Task] = {}
        self._client = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._max_chars = max(cfg.max_context_tokens - cfg.max_new_tokens, 64) * CHARS_PER_TOKEN

    # ------------------------------------------------------------ the Engine interface

    def submit(self, request: GenerationRequest) -> AsyncIterator[TokenEvent]:
        ended = refusal(request) or unscored(request)
        if ended is not None:
            return ended
        if request.prompt_ids is not None:
            return EndedStream(
                final_event(FinishReason.ERROR, "bad request: prompt_ids need the built-in engine")
            )
        request.submit_ns = time.perf_counter_ns()
        loop = asyncio.get_running_loop()
        stream = TokenStream(loop)
        self._ledger.opened(request.request_id)
        task = loop.create_task(self._serve(request, stream), name=f"llm-{request.request_id}")
        task.add_done_callback(lambda t: self._unstarted(t, request.request_id, stream))
        self._tasks[request.request_id] = task
        return stream

    def _unstarted(self, task: asyncio.Task, request_id: str, stream: TokenStream) -> None:
        """A task cancelled before it ran never reached ``_serve``'s handlers: end its stream."""
        if request_id in self._tasks and self._tasks[request_id] is task:
            self._tasks.pop(request_id)
            self._ledger.closed(request_id, FinishReason.CANCELLED, 0)
            stream.put(final_event(FinishReason.CANCELLED))

    def cancel(self, request_id: str) -> None:
        task = self._tasks.get(request_id)
        if task is not None and not task.done():
            task.cancel()

    def stats(self) -> EngineStats:
        return self._ledger.snapshot()

    def live_requests(self) -> set[str]:
        return self._ledger.live()

    def close(self) -> None:
        for task in list(self._tasks.values()):
            task.cancel()
        client, self._client = self._client, None
        if client is not None and self._loop is not None and not self._loop.is_closed():
            try:
                if self._loop.is_running():
                    asyncio.run_coroutine_threadsafe(client.close(), self._loop)
            except RuntimeError:
                pass

    # ------------------------------------------------------------ one request

    def _http(self):
        if self._client is None:
            import openai

            c = self.cfg
            self._loop = asyncio.get_running_loop()
            self._client = openai.AsyncOpenAI(
                base_url=c.base_url,
                api_key=api_key(c),
                max_retries=0,
                timeout=openai.Timeout(c.stall_timeout_s, connect=c.connect_timeout_s),
            )
        return self._client

    async def _serve(self, request: GenerationRequest, stream: TokenStream) -> None:
        """Run the request to its end and put the final event, whatever happens."""
        counts = _Counts()
        final: TokenEvent
        try:
            reason = await self._attempts(request, stream, counts)
            final = final_event(reason, None, counts.tokens, counts.start_ns, counts.prompt)
        except asyncio.CancelledError:
            final = final_event(
                FinishReason.CANCELLED, None, counts.tokens, counts.start_ns, counts.prompt
            )
        except _Failed as exc:
            log.warning("llm request %s failed: %s", request.request_id, exc)
            final = final_event(
                FinishReason.ERROR, str(exc), counts.tokens, counts.start_ns, counts.prompt
            )
        except Exception as exc:  # a bug here must end this request, not hang its caller
            log.exception("llm request %s", request.request_id)
            final = final_event(
                FinishReason.ERROR,
                f"LLM client failed: {type(exc).__name__}",
                counts.tokens,
                counts.start_ns,
                counts.prompt,
            )
        finally:
            self._tasks.pop(request.request_id, None)
        self._ledger.closed(
            request.request_id, final.finish_reason or FinishReason.STOP, counts.tokens
        )
        stream.put(final)

    async def _attempts(
        self, request: GenerationRequest, stream: TokenStream, counts: _Counts
    ) -> str:
        """Attempts until one streams a reply; its finish reason."""
        body = request_body(
            self.model,
            fit_messages(request.messages, self._max_chars),
            request.max_new_tokens,
            request.tools,
            request.tool_choice,
            request.parallel_tool_calls,
        )
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.cfg.first_token_timeout_s
        for attempt in range(self.cfg.retries + 1):
            try:
                return await self._attempt(body, deadline, stream, counts)
            except _Retry as exc:
                wait = BACKOFF_S * 2**attempt
                if attempt == self.cfg.retries or loop.time() + wait >= deadline:
                    raise _Failed(
                        f"the LLM server ({self.cfg.base_url}) is unavailable: "
                        f"{exc} (after {attempt + 1} attempts)"
                    ) from None
                log.info("llm request %s: %s; retrying", request.request_id, exc)
                await asyncio.sleep(wait)
        raise AssertionError("unreachable")

    async def _attempt(
        self, body: dict, deadline: float, stream: TokenStream, counts: _Counts
    ) -> str:
        import openai

        counts.start_ns = time.perf_counter_ns()
        reader = StreamReader()
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout_at(deadline) as timer:
                async with self._http().chat.completions.with_streaming_response.create(
                    **body, extra_body=self.cfg.extra or None
                ) as response:
                    async for line in response.iter_lines():
                        payload = sse_data(line)
                        if payload is None:
                            continue
                        text = reader.feed(payload)
                        counts.prompt = reader.prompt_tokens or counts.prompt
                        if text:
                            counts.put(stream, text)
                            timer.reschedule(loop.time() + self.cfg.stall_timeout_s)
                        if reader.done:
                            break
        except TimeoutError:
            if counts.tokens:
                raise _Failed(
                    f"the LLM server ({self.cfg.base_url}) stalled: no token for "
                    f"{self.cfg.stall_timeout_s:g} s after {counts.tokens}"
                ) from None
            raise _Failed(
                f"the LLM server ({self.cfg.base_url}) sent no token within "
                f"{self.cfg.first_token_timeout_s:g} s"
            ) from None
        except openai.APIStatusError as exc:
            why = f"HTTP {exc.status_code}: {_message(exc)}"
            if exc.status_code in RETRY_STATUS and not counts.tokens:
                raise _Retry(why) from None
            raise _Failed(
                f"the LLM server ({self.cfg.base_url}) refused the request ({why})"
            ) from None
        except (openai.APIConnectionError, OSError) as exc:
            if not counts.tokens:
                raise _Retry(f"{type(exc).__name__}: {exc}") from None
            raise _Failed(
                f"the LLM server's stream broke after {counts.tokens} tokens ({type(exc).__name__})"
            ) from None
        except UpstreamError as exc:
            raise _Failed(str(exc)) from None
        if reader.finish_reason is None and not reader.done:
            if not counts.tokens:
                raise _Retry("the stream ended before its first token")
            raise _Failed(
                f"the LLM server's stream ended after {counts.tokens} tokens without "
                f"a finish reason"
            )
        tail = reader.close()
        if tail:
            counts.put(stream, tail)
        counts.prompt = reader.prompt_tokens or counts.prompt
        return _FINISH.get(reader.finish_reason or "stop", FinishReason.STOP)


class _Counts:
    """What one request has produced so far (across its attempts)."""

    __slots__ = ("prompt", "start_ns", "tokens")

    def __init__(self) -> None:
        self.tokens = 0
        self.prompt = 0
        self.start_ns = 0

    def put(self, stream: TokenStream, text: str) -> None:
        """One more token event of text, stamped now."""
        stream.put(
            TokenEvent(self.tokens, -1, text, time.perf_counter_ns(), self.start_ns, self.prompt)
        )
        self.tokens += 1


def _message(exc) -> str:
    body = getattr(exc, "body", None)
    if isinstance(body, dict):
        err = body.get("error", body)
        if isinstance(err, dict) and err.get("message"):
            return str(err["message"])[:300]
    return str(exc)[:300]
