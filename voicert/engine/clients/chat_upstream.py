"""The client side of OpenAI chat completions, sans-I/O: the body voicert sends to an
OpenAI-compatible server (``llm.engine: openai``) and its server-sent events read back. No sockets.

Prompt caching on the server needs the prompt's prefix byte-identical from turn to turn: messages
are written the same way every time (no timestamps, no ids that change), tool schemas in their
canonical JSON, and the body's keys in a fixed order.

A reply's tool calls come back structured (``delta.tool_calls``). :class:`StreamReader` writes them
into the text stream in the HERMES form (``<tool_call>\\n{"name": ..., "arguments": {...}}\\n
</tool_call>``, ``engine/core/tools.py``) that the agent's call parser reads for every engine, so a
remote model's calls reach the agent exactly as a local model's do, argument deltas as they come.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import msgspec

from voicert.core.chat import AUTO, ChatMessage, ToolChoice, ToolChoiceMode, ToolSpec
from voicert.engine.core.tools import HERMES_CLOSE, HERMES_OPEN

_decoder = msgspec.json.Decoder()
DONE = "[DONE]"


class UpstreamError(Exception):
    """The server's stream said something that is not a chat completion chunk (an error object
    mid-stream, or text that is not JSON)."""


def wire_message(m: ChatMessage) -> dict[str, Any]:
    """One message in the OpenAI shape (assistant ``tool_calls``, ``tool`` results by call id)."""
    if m.role == "assistant" and m.tool_calls:
        return {
            "role": "assistant",
            "content": m.content or None,
            "tool_calls": [
                {
                    "id": c.call_id,
                    "type": "function",
                    "function": {"name": c.name, "arguments": c.arguments},
                }
                for c in m.tool_calls
            ],
        }
    if m.role == "tool":
        return {"role": "tool", "tool_call_id": m.tool_call_id, "content": m.content}
    return {"role": m.role, "content": m.content}


def _choice(choice: ToolChoice) -> str | dict[str, Any]:
    if choice.mode is ToolChoiceMode.NAMED:
        return {"type": "function", "function": {"name": choice.name}}
    return choice.mode.value


def request_body(
    model: str,
    messages: list[ChatMessage],
    max_tokens: int,
    tools: tuple[ToolSpec, ...] = (),
    tool_choice: ToolChoice = AUTO,
    parallel_tool_calls: bool = True,
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A streamed request with usage. ``extra`` (``llm.extra``: sampling settings, a server's own
    fields) is added last and may not replace what this function sets."""
    body: dict[str, Any] = {
        "model": model,
        "messages": [wire_message(m) for m in messages],
        "max_tokens": max_tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if tools:
        body["tools"] = [t.openai() for t in tools]
        body["tool_choice"] = _choice(tool_choice)
        if not parallel_tool_calls:
            body["parallel_tool_calls"] = False
    for key, value in (extra or {}).items():
        if key in body:
            raise ValueError(f"llm.extra may not set {key!r} (voicert sets it)")
        body[key] = value
    return body


def fit_messages(messages: list[ChatMessage], max_chars: int) -> list[ChatMessage]:
    """The conversation cut to at most ``max_chars`` of content by dropping its oldest turns (the
    first message, the system prompt, stays; a tool result never loses its call). The remote
    server's tokenizer is unknown here, so the budget is in characters."""

    def size(m: ChatMessage) -> int:
        return len(m.content) + sum(len(c.arguments) + len(c.name) for c in m.tool_calls) + 16

    head, rest = messages[:1], list(messages[1:])
    total = sum(size(m) for m in messages)
    while rest and total > max_chars and len(rest) > 1:
        total -= size(rest.pop(0))
        while rest and rest[0].role in ("tool", "assistant"):  # start at a user turn
            if len(rest) == 1:
                break
            total -= size(rest.pop(0))
    return head + rest


def sse_data(line: str) -> str | None:
    """The payload of one server-sent-event line (``data: ...``), or None for any other line
    (comments, ``event:``, blank separators)."""
    if line.startswith("data:"):
        return line[5:].strip()
    return None


@dataclass(slots=True)
class _Call:
    name: str = ""
    opened: bool = False
    args: str = ""  # arguments that came before the name (written once it is known)
    wrote_args: bool = False


@dataclass(slots=True)
class StreamReader:
    """Reads one streamed completion, chunk by chunk. :meth:`feed` takes one ``data:`` payload and
    returns the text it adds (tool calls written as HERMES text); :attr:`done` once ``[DONE]``
    arrived. ``finish_reason`` and the usage are kept as they appear."""

    finish_reason: str | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    done: bool = False
    chunks: int = 0  # chunks that carried text or a call
    _calls: dict[int, _Call] = field(default_factory=dict)
    _open: int | None = None  # the call whose text is being written

    def feed(self, payload: str) -> str:
        """Raises UpstreamError for an error object or a payload that is not JSON."""
        if payload == DONE:
            self.done = True
            return self.close()
        try:
            chunk = _decoder.decode(payload)
        except msgspec.DecodeError:
            raise UpstreamError(f"not a JSON chunk: {payload[:120]!r}") from None
        if not isinstance(chunk, dict):
            raise UpstreamError(f"not a chunk object: {payload[:120]!r}")
        if "error" in chunk:
            err = chunk["error"]
            msg = err.get("message") if isinstance(err, dict) else err
            raise UpstreamError(f"the server failed mid-stream: {str(msg)[:300]}")
        usage = chunk.get("usage")
        if isinstance(usage, dict):
            self.prompt_tokens = int(usage.get("prompt_tokens") or 0)
            self.completion_tokens = int(usage.get("completion_tokens") or 0)
        out = []
        for choice in chunk.get("choices") or ():
            if not isinstance(choice, dict) or choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta") or {}
            if delta.get("content"):
                out.append(self._end_call() + delta["content"])
            for call in delta.get("tool_calls") or ():
                out.append(self._call_delta(call))
            if choice.get("finish_reason"):
                self.finish_reason = choice["finish_reason"]
        text = "".join(out)
        self.chunks += bool(text)
        return text

    def close(self) -> str:
        """The text that ends a call still open (the stream is over)."""
        return self._end_call()

    def _call_delta(self, call: dict[str, Any]) -> str:
        index = call.get("index", 0)
        fn = call.get("function") or {}
        out = ""
        if index != self._open:
            out += self._end_call()
            self._open = index
        state = self._calls.setdefault(index, _Call())
        if fn.get("name"):
            state.name += fn["name"]
        if not state.opened and state.name:
            state.opened = True
            out += f'{HERMES_OPEN}\n{{"name": {json.dumps(state.name)}, "arguments": '
        state.args += fn.get("arguments") or ""
        if state.opened and state.args:
            out += state.args
            state.args, state.wrote_args = "", True
        return out

    def _end_call(self) -> str:
        if self._open is None:
            return ""
        state, self._open = self._calls[self._open], None
        if not state.opened:
            return ""
        return ("" if state.wrote_args else "{}") + f"}}\n{HERMES_CLOSE}\n"
