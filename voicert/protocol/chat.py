"""OpenAI chat completions (``POST /v1/chat/completions``), sans-I/O: a JSON body in, a typed
:class:`ChatRequest` or a :class:`ChatError` out; response bodies and stream chunks built as plain
maps. No sockets, no asyncio. See ``docs/protocol.md``.

One choice, greedy unless ``temperature`` (with ``top_p``, ``top_k`` and ``seed``) asks for sampling, which
the engine does: a request that asks for something it would not honour (``n`` above 1, penalties,
``logprobs``...) is refused with the parameter named, never silently served differently. ``tools`` / ``tool_choice`` / ``parallel_tool_calls`` are
served: calls are decoded under their schemas, returned as ``tool_calls``; the conversation may
hold assistant ``tool_calls`` and ``tool`` messages.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from voicert.core.chat import AUTO, ChatMessage, ToolCall, ToolChoice, ToolSpec
from voicert.core.llm import GREEDY, Sampling, sampling_problem
from voicert.protocol import jsontext
from voicert.protocol.tools import WireError, choice_from_wire, tools_from_wire

MAX_STOP_STRINGS = 4
# accepted as long as they ask for nothing the engine does not do (one choice, no penalties)
_NEUTRAL = {"n": 1, "presence_penalty": 0, "frequency_penalty": 0}
# sampled decoding (voicert.core.llm.Sampling); top_k is vLLM's and SGLang's extension (-1: all)
_SAMPLING = ("temperature", "top_p", "top_k", "seed")
_IGNORABLE = {"user", "store", "metadata", "service_tier"}  # change nothing we serve
# OpenAI's documented defaults, which clients may send explicitly: accepted at that value (or
# null), refused at any other, with the parameter named
_DEFAULTS: dict[str, tuple[str, Any]] = {
    "logprobs": ("false", lambda v: v is False),
    "top_logprobs": ("absent", lambda v: False),
    "response_format": ('{"type": "text"}', lambda v: v == {"type": "text"}),
    "logit_bias": ("{}", lambda v: v == {}),
}
_KNOWN = {
    "model",
    "messages",
    "stream",
    "stream_options",
    "max_tokens",
    "max_completion_tokens",
    "stop",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    *_NEUTRAL,
    *_SAMPLING,
    *_IGNORABLE,
    *_DEFAULTS,
}
_ROLES = {
    "system": "system",
    "developer": "system",
    "user": "user",
    "assistant": "assistant",
    "tool": "tool",
}


class ChatError(Exception):
    """A refused request: the HTTP status and the OpenAI error object."""

    def __init__(
        self,
        status: int,
        message: str,
        param: str | None = None,
        code: str | None = None,
        kind: str = "invalid_request_error",
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.kind = (
            status,
            message,
            param,
            code,
            kind,
        )

    def body(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": self.kind,
                "param": self.param,
                "code": self.code,
            }
        }


@dataclass(frozen=True, slots=True)
class ChatRequest:
    model: str
    messages: list[ChatMessage]
    max_tokens: int | None = None  # None: the server's default
    stream: bool = False
    include_usage: bool = False  # stream_options.include_usage
    stop: tuple[str, ...] = ()
    tools: tuple[ToolSpec, ...] = ()
    tool_choice: ToolChoice = AUTO
    parallel_tool_calls: bool = True
    sampling: Sampling = GREEDY  # temperature, top_p, seed (greedy when temperature is 0 or absent)
    id: str = field(default_factory=lambda: f"chatcmpl-{uuid.uuid4().hex[:24]}")
    created: int = field(default_factory=lambda: int(time.time()))


def _bad(message: str, param: str | None = None, code: str = "invalid_value") -> ChatError:
    return ChatError(400, message, param, code)


def parse_request(body: bytes, max_text_chars: int) -> ChatRequest:
    """The request a body asks for, or :class:`ChatError` saying what is wrong with it."""
    try:
        data = jsontext.loads(body)
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise _bad(f"body is not JSON: {exc}", code="invalid_json") from None
    if not isinstance(data, dict):
        raise _bad("body must be a JSON object")
    unknown = sorted(set(data) - _KNOWN)
    if unknown:
        raise _bad(f"unsupported parameter: {unknown[0]}", unknown[0], "unsupported_parameter")
    for key, neutral in _NEUTRAL.items():
        value = data.get(key)
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, (int, float)) or value != neutral
        ):
            raise _bad(
                f"{key} must be {neutral} or absent: voicert gives one choice, no penalties",
                key,
                "unsupported_value",
            )
    for key, (default, is_default) in _DEFAULTS.items():
        value = data.get(key)
        if value is not None and not is_default(value):
            raise _bad(
                f"{key} must be {default}, null or absent: voicert does not serve it",
                key,
                "unsupported_value",
            )
    model = data.get("model")
    if not isinstance(model, str) or not model:
        raise _bad("model must be a non-empty string", "model")
    stream = data.get("stream", False)
    if stream is not None and not isinstance(stream, bool):
        raise _bad("stream must be a boolean", "stream")
    tools, choice = _tools(data)
    parallel = data.get("parallel_tool_calls", True)
    if not isinstance(parallel, bool):
        raise _bad("parallel_tool_calls must be a boolean", "parallel_tool_calls")
    return ChatRequest(
        model,
        _messages(data.get("messages"), max_text_chars),
        _max_tokens(data),
        bool(stream),
        _include_usage(data, bool(stream)),
        _stop(data.get("stop")),
        tools,
        choice,
        parallel,
        _sampling(data),
    )


def _sampling(data: dict) -> Sampling:
    """``temperature`` (0-2), ``top_p`` (0-1], ``top_k`` (>= 0, or -1: all, as vLLM takes it)
    and ``seed`` as the engine takes them. Absent, or a temperature of 0: greedy (the voice
    default; OpenAI samples at 1 when it is absent)."""
    for key in _SAMPLING:
        value = data.get(key)
        integer = key in ("seed", "top_k")
        whole = not integer or isinstance(value, int)
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, (int, float)) or not whole
        ):
            raise _bad(f"{key} must be {'an integer' if integer else 'a number'}", key)
    temperature, top_p, top_k = data.get("temperature"), data.get("top_p"), data.get("top_k")
    sampling = Sampling(
        float(0 if temperature is None else temperature),
        float(1 if top_p is None else top_p),
        0 if top_k in (None, -1) else top_k,
        data.get("seed"),
    )
    if problem := sampling_problem(sampling):
        raise _bad(problem, problem.split()[0])
    return sampling


def _tools(data: dict) -> tuple[tuple[ToolSpec, ...], ToolChoice]:
    try:
        tools = tools_from_wire(data["tools"]) if data.get("tools") is not None else ()
        choice = (
            choice_from_wire(data["tool_choice"]) if data.get("tool_choice") is not None else AUTO
        )
    except WireError as exc:
        raise _bad(str(exc), exc.param) from None
    if choice.name and choice.name not in {t.name for t in tools}:
        raise _bad(
            f"tool_choice names {choice.name!r}, which is not among the tools", "tool_choice"
        )
    return tools, choice


def _messages(raw: Any, max_text_chars: int) -> list[ChatMessage]:
    if not isinstance(raw, list) or not raw:
        raise _bad("messages must be a non-empty array", "messages")
    out = []
    for i, m in enumerate(raw):
        where = f"messages[{i}]"
        if not isinstance(m, dict):
            raise _bad(f"{where} must be an object", where)
        role = m.get("role")
        if role not in _ROLES:
            raise _bad(
                f"{where}.role {role!r} is not supported (system, developer, user, "
                f"assistant, tool)",
                f"{where}.role",
                "unsupported_value",
            )
        allowed = {"role", "content", "name"} | (
            {"tool_calls", "refusal"}
            if role == "assistant"
            else {"tool_call_id"}
            if role == "tool"
            else set()
        )
        extra = sorted(set(m) - allowed)
        if extra:
            raise _bad(
                f"{where}.{extra[0]} is not supported",
                f"{where}.{extra[0]}",
                "unsupported_parameter",
            )
        calls = _calls(m.get("tool_calls"), where) if role == "assistant" else ()
        content = "" if calls and m.get("content") is None else _content(m.get("content"), where)
        if len(content) > max_text_chars:
            raise _bad(
                f"{where}.content is over {max_text_chars} characters",
                f"{where}.content",
                "string_above_max_length",
            )
        call_id = m.get("tool_call_id", "") if role == "tool" else ""
        if role == "tool" and (not isinstance(call_id, str) or not call_id):
            raise _bad(f"{where}.tool_call_id must be a non-empty string", f"{where}.tool_call_id")
        out.append(ChatMessage(_ROLES[role], content, calls, call_id))
    return out


def _calls(raw: Any, where: str) -> tuple[ToolCall, ...]:
    """An assistant message's ``tool_calls``."""
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise _bad(f"{where}.tool_calls must be an array", f"{where}.tool_calls")
    calls = []
    for j, c in enumerate(raw):
        at = f"{where}.tool_calls[{j}]"
        fn = c.get("function") if isinstance(c, dict) else None
        if (
            not isinstance(fn, dict)
            or not isinstance(c.get("id"), str)
            or not isinstance(fn.get("name"), str)
            or not isinstance(fn.get("arguments"), str)
        ):
            raise _bad(f"{at} must be {{id, type: function, function: {{name, arguments}}}}", at)
        try:
            if not isinstance(json.loads(fn["arguments"]), dict):
                raise ValueError
        except ValueError:
            raise _bad(
                f"{at}.function.arguments must be JSON text of an object",
                f"{at}.function.arguments",
            ) from None
        calls.append(ToolCall(c["id"], fn["name"], fn["arguments"]))
    return tuple(calls)


def _content(raw: Any, where: str) -> str:
    if isinstance(raw, str):
        return raw
    if isinstance(raw, list):
        parts = []
        for j, part in enumerate(raw):
            if not (
                isinstance(part, dict)
                and part.get("type") == "text"
                and isinstance(part.get("text"), str)
            ):
                raise _bad(
                    f"{where}.content[{j}]: only text parts are supported",
                    f"{where}.content",
                    "unsupported_value",
                )
            parts.append(part["text"])
        return "".join(parts)
    raise _bad(f"{where}.content must be a string or an array of text parts", f"{where}.content")


def _max_tokens(data: dict) -> int | None:
    for key in ("max_completion_tokens", "max_tokens"):
        value = data.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise _bad(f"{key} must be a positive integer", key)
        return value
    return None


def _include_usage(data: dict, stream: bool) -> bool:
    opts = data.get("stream_options")
    if opts is None:
        return False
    if not stream:
        raise _bad("stream_options is only allowed with stream: true", "stream_options")
    if (
        not isinstance(opts, dict)
        or set(opts) - {"include_usage"}
        or not isinstance(opts.get("include_usage", False), bool)
    ):
        raise _bad("stream_options supports include_usage (a boolean) only", "stream_options")
    return bool(opts.get("include_usage", False))


def _stop(raw: Any) -> tuple[str, ...]:
    if raw is None:
        return ()
    stops = [raw] if isinstance(raw, str) else raw
    if (
        not isinstance(stops, list)
        or len(stops) > MAX_STOP_STRINGS
        or not all(isinstance(s, str) and s for s in stops)
    ):
        raise _bad(f"stop must be a non-empty string or up to {MAX_STOP_STRINGS} of them", "stop")
    return tuple(stops)


class StopMatcher:
    """Cuts streamed text at the first stop string. ``push`` returns the text safe to send now
    (it holds back a tail that could still grow into a stop string) and whether a stop string
    was reached; ``flush`` returns what is held back at the end of the reply.

    Linear in the text and the stop strings (Knuth-Morris-Pratt, one automaton per stop string):
    each pushed character moves every automaton once, amortised, however long a stop string a
    client sends (a quadratic suffix scan froze the event loop for minutes at the body limit)."""

    def __init__(self, stops: tuple[str, ...]) -> None:
        self.stops = tuple(s for s in stops if s)
        self._fail = [_prefix_function(s) for s in self.stops]
        self._state = [0] * len(self.stops)  # per stop: the longest prefix the text ends with
        self.held = ""

    def push(self, delta: str) -> tuple[str, bool]:
        if not self.stops:
            return delta, False
        text = self.held + delta
        cut = -1
        for k, stop in enumerate(self.stops):
            end, self._state[k] = self._advance(k, delta)
            if end >= 0:  # this stop's first occurrence ends at delta[end]
                start = len(self.held) + end + 1 - len(stop)
                cut = start if cut < 0 else min(cut, start)
        if cut >= 0:
            self.held = ""
            self._state = [0] * len(self.stops)
            return text[:cut], True
        keep = max(self._state)
        self.held = text[len(text) - keep :] if keep else ""
        return text[: len(text) - keep], False

    def _advance(self, k: int, delta: str) -> tuple[int, int]:
        """Stop ``k``'s automaton over ``delta``: (index in delta where the stop string is
        first complete, or -1; the state after)."""
        stop, fail, q = self.stops[k], self._fail[k], self._state[k]
        for i, ch in enumerate(delta):
            while q and stop[q] != ch:
                q = fail[q - 1]
            if stop[q] == ch:
                q += 1
            if q == len(stop):
                return i, q
        return -1, q

    def flush(self) -> str:
        held, self.held = self.held, ""
        self._state = [0] * len(self.stops)
        return held


def _prefix_function(s: str) -> list[int]:
    """pi[i]: the length of the longest proper prefix of ``s[: i + 1]`` that is also its
    suffix (KMP's failure links), in O(len(s))."""
    pi = [0] * len(s)
    q = 0
    for i in range(1, len(s)):
        while q and s[i] != s[q]:
            q = pi[q - 1]
        if s[i] == s[q]:
            q += 1
        pi[i] = q
    return pi


def finish_reason(engine_reason: str, called: bool = False) -> str:
    """The OpenAI finish reason for how a reply ended (the model's end, or a stop string: stop;
    a reply that made tool calls: tool_calls)."""
    if engine_reason == "length":
        return "length"
    return "tool_calls" if called else "stop"


def call_wire(call: ToolCall) -> dict[str, Any]:
    return {
        "id": call.call_id,
        "type": "function",
        "function": {"name": call.name, "arguments": call.arguments},
    }


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def completion(
    req: ChatRequest,
    model: str,
    text: str,
    reason: str,
    prompt_tokens: int,
    completion_tokens: int,
    calls: tuple[ToolCall, ...] = (),
) -> dict[str, Any]:
    """A whole (non-streamed) response body."""
    message: dict[str, Any] = {
        "role": "assistant",
        "content": text or (None if calls else ""),
        "refusal": None,
    }
    if calls:
        message["tool_calls"] = [call_wire(c) for c in calls]
    return {
        "id": req.id,
        "object": "chat.completion",
        "created": req.created,
        "model": model,
        "choices": [{"index": 0, "message": message, "logprobs": None, "finish_reason": reason}],
        "usage": usage(prompt_tokens, completion_tokens),
    }


def chunk(
    req: ChatRequest,
    model: str,
    delta: dict[str, Any] | None = None,
    reason: str | None = None,
    usage_: dict[str, int] | None = None,
) -> dict[str, Any]:
    """One stream chunk: a delta, the finish reason, or (``usage_``: no choices) the usage."""
    body: dict[str, Any] = {
        "id": req.id,
        "object": "chat.completion.chunk",
        "created": req.created,
        "model": model,
    }
    if usage_ is not None:
        body["choices"] = []
        body["usage"] = usage_
    else:
        body["choices"] = [
            {"index": 0, "delta": delta or {}, "logprobs": None, "finish_reason": reason}
        ]
        if req.include_usage:
            body["usage"] = None
    return body


def sse(payload: dict[str, Any] | str) -> bytes:
    """One server-sent event (``data: ...``)."""
    data = payload if isinstance(payload, str) else json.dumps(payload, separators=(",", ":"))
    return f"data: {data}\n\n".encode()


def models_list(model: str, created: int) -> dict[str, Any]:
    return {
        "object": "list",
        "data": [{"id": model, "object": "model", "created": created, "owned_by": "voicert"}],
    }
