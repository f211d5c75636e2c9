"""A reply's text stream split into what is said and the tool calls it makes. Pure: no I/O.

Feed each text delta as it comes; :class:`CallParser` hands back :class:`Said` text (safe to send
and speak: text that could still turn into a call marker is held back) and, per call,
:class:`CallOpened` (its tool's name known), :class:`CallArgs` deltas of its arguments' JSON as they
are decoded, then :class:`CallClosed` (or :class:`CallBroken` when the reply ended inside it).

Both formats of ``engine/core/tools.py`` are read: HERMES (``<tool_call>\\n{"name": ..., "arguments":
{...}}\\n</tool_call>`` anywhere in the reply) and LLAMA3 (a reply that opens with ``{``, optionally
after ``<|python_tag|>``: ``{"name": ..., "parameters": {...}}``).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Union

from voicert.engine.core.tools import HERMES_CLOSE, HERMES_OPEN

PYTHON_TAG = "<|python_tag|>"
_NAME = re.compile(r'"name"\s*:\s*"((?:[^"\\]|\\.)*)"')
_ARGS = re.compile(r'"(?:arguments|parameters)"\s*:\s*')


@dataclass(frozen=True, slots=True)
class Said:
    text: str


@dataclass(frozen=True, slots=True)
class CallOpened:
    index: int  # 0-based call number within the reply
    name: str


@dataclass(frozen=True, slots=True)
class CallArgs:
    index: int
    delta: str  # more of the arguments' JSON text


@dataclass(frozen=True, slots=True)
class CallClosed:
    index: int
    name: str
    arguments: str  # JSON text of an object: the CallArgs deltas joined


@dataclass(frozen=True, slots=True)
class CallBroken:
    index: int
    text: str  # what the call's text was when the reply ended (or why it did not parse)


Piece = Union[Said, CallOpened, CallArgs, CallClosed, CallBroken]


class _ObjectScan:
    """Tracks where a JSON value that opens with ``{`` ends, one character at a time."""

    def __init__(self) -> None:
        self.depth = 0
        self.in_string = False
        self.escape = False
        self.done = False

    def push(self, ch: str) -> None:
        if self.in_string:
            if self.escape:
                self.escape = False
            elif ch == "\\":
                self.escape = True
            elif ch == '"':
                self.in_string = False
        elif ch == '"':
            self.in_string = True
        elif ch == "{":
            self.depth += 1
        elif ch == "}":
            self.depth -= 1
            self.done = self.depth == 0


class _Call:
    """One call being decoded: its text, its name once seen, its arguments as they stream."""

    def __init__(self, index: int, closer: str) -> None:
        self.index = index
        self.closer = closer  # the text that ends it ("" for LLAMA3: the object's own end)
        self.text = ""
        self.name: str | None = None
        self.args_from: int | None = None  # index in text where the arguments' "{" is
        self._scanned = 0  # text before this index has been through args_scan
        self.args_scan = _ObjectScan()
        self.args = ""
        self.outer = _ObjectScan()  # the call's own object (LLAMA3 ends with it)

    def feed(self, delta: str) -> list[Piece]:
        out: list[Piece] = []
        self.text += delta
        for ch in delta:
            self.outer.push(ch)
        if self.name is None:
            m = _NAME.search(self.text)
            if m:
                self.name = json.loads(f'"{m.group(1)}"')
                out.append(CallOpened(self.index, self.name))
        if self.args_from is None:
            m = _ARGS.search(self.text)
            if m and m.end() < len(self.text) and self.text[m.end()] == "{":
                self.args_from = m.end()
        if self.args_from is not None and self.name is not None and not self.args_scan.done:
            new = []
            for ch in self.text[max(self._scanned, self.args_from) :]:
                if self.args_scan.done:
                    break
                self.args_scan.push(ch)
                new.append(ch)
            self._scanned = len(self.text)
            if new:
                self.args += "".join(new)
                out.append(CallArgs(self.index, "".join(new)))
        return out

    def close(self) -> list[Piece]:
        """The call's text is complete: check it and close it."""
        body = self.text[: len(self.text) - len(self.closer)] if self.closer else self.text
        try:
            obj = json.loads(body)
            name = obj["name"]
            args = obj.get("arguments", obj.get("parameters", {}))
            if not isinstance(name, str) or not isinstance(args, dict):
                raise ValueError("name must be a string and arguments an object")
        except (ValueError, KeyError, TypeError) as exc:
            return [CallBroken(self.index, f"{body[:200]} ({exc})")]
        out: list[Piece] = []
        if self.name is None:
            out.append(CallOpened(self.index, name))
        if not self.args_scan.done:  # not streamed (keys in another order): all at once
            self.args = json.dumps(args)
            out.append(CallArgs(self.index, self.args))
        out.append(CallClosed(self.index, name, self.args))
        return out


class CallParser:
    """Contract: :meth:`feed` each delta in order, then :meth:`close` once. The :class:`Said`
    texts joined are the reply's text without its calls."""

    def __init__(self) -> None:
        self._held = ""  # said text that may be the start of a call marker
        self._call: _Call | None = None
        self._count = 0
        self._started = False  # some non-space text has been seen (LLAMA3 calls open a reply)
        self._after_call = False  # a call just closed
        self.said: list[str] = []

    def feed(self, delta: str) -> list[Piece]:
        out: list[Piece] = []
        text = self._held + delta
        self._held = ""
        while text:
            if self._call is not None:
                text = self._in_call(self._call, text, out)
                continue
            if self._after_call:  # the space between calls, or after the last, is not said
                text = text.lstrip()
                self._after_call = not text
                if not text:
                    break
            if not self._started:
                stripped = text.lstrip()
                if stripped.startswith(PYTHON_TAG):  # Llama's marker of a call: not said
                    text = stripped[len(PYTHON_TAG) :]
                    continue
                if not stripped or PYTHON_TAG.startswith(stripped):
                    self._held = text
                    return out
                self._started = True
                if stripped.startswith("{"):
                    self._call = _Call(self._count, "")
                    text = stripped
                    continue
            at = text.find(HERMES_OPEN)
            if at >= 0:
                self._say(text[:at], out)
                self._call = _Call(self._count, HERMES_CLOSE)
                text = text[at + len(HERMES_OPEN) :]
                continue
            keep = _partial_suffix(text, HERMES_OPEN)
            self._say(text[: len(text) - keep], out)
            self._held = text[len(text) - keep :]
            text = ""
        return out

    def _in_call(self, call: _Call, text: str, out: list[Piece]) -> str:
        """Feed ``call``, the one in progress; the text after its end, if it ended."""
        if call.closer:
            seen = call.text + text
            end = seen.find(call.closer, max(len(call.text) - len(call.closer), 0))
            if end < 0:
                out.extend(call.feed(text))
                return ""
            cut = end + len(call.closer) - len(call.text)
            out.extend(call.feed(text[:cut]))
            rest = text[cut:]
        else:
            rest = ""
            for i, ch in enumerate(text):
                out.extend(call.feed(ch))
                if call.outer.done:
                    rest = text[i + 1 :]
                    break
            if not call.outer.done:
                return ""
        out.extend(call.close())
        self._call = None
        self._count += 1
        self._after_call = True
        return rest

    def _say(self, text: str, out: list[Piece]) -> None:
        if text:
            self.said.append(text)
            out.append(Said(text))

    def close(self) -> list[Piece]:
        """The reply has ended: held text is said; a call still open is broken."""
        out: list[Piece] = []
        if self._call is not None:
            out.append(CallBroken(self._call.index, self._call.text[:200]))
            self._call = None
        elif self._held:
            self._say(self._held, out)
        self._held = ""
        return out


class RepeatFilter:
    """Drops a call that exactly repeats an earlier call of the same reply (small models loop:
    the same call again and again until the length limit). Contract: :meth:`push` every piece of
    a :class:`CallParser`, in order; it returns the pieces to act on. A call that so far repeats
    an earlier complete one (its name, its arguments a prefix of that one's) is held back; once
    it differs its pieces come out, and if it ends as an exact repeat (or is cut off while still
    a repeat) it is dropped unseen. ``looping`` is set by the first exact repeat: under greedy
    decoding the rest of the reply is more of the same, and the caller may stop generating."""

    def __init__(self) -> None:
        self.looping = False
        self.done: list[tuple[str, str]] = []  # (name, arguments) of the calls let through
        self._held: dict[int, list[Piece]] = {}  # call index -> its pieces, while it repeats

    def push(self, pieces: list[Piece]) -> list[Piece]:
        out: list[Piece] = []
        for piece in pieces:
            if isinstance(piece, Said):
                out.append(piece)
                continue
            if isinstance(piece, CallOpened) and any(n == piece.name for n, _ in self.done):
                self._held[piece.index] = []
            held = self._held.get(piece.index)
            if held is None:
                self._let_through(piece, out)
            elif isinstance(piece, CallBroken):
                del self._held[piece.index]  # a repeat cut off: never shown, not reported
            else:
                held.append(piece)
                self._settle(piece, held, out)
        return out

    def _settle(
        self, piece: CallOpened | CallArgs | CallClosed, held: list[Piece], out: list[Piece]
    ) -> None:
        opened = held[0]
        assert isinstance(opened, CallOpened)  # a held call's list starts with its opening
        name = opened.name
        args = "".join(p.delta for p in held if isinstance(p, CallArgs))
        if isinstance(piece, CallClosed) and (name, args) in self.done:
            del self._held[piece.index]  # an exact repeat
            self.looping = True
        elif not any(n == name and a.startswith(args) for n, a in self.done):
            del self._held[piece.index]  # it differs: a call of its own
            for p in held:
                self._let_through(p, out)

    def _let_through(self, piece: Piece, out: list[Piece]) -> None:
        if isinstance(piece, CallClosed):
            self.done.append((piece.name, piece.arguments))
        out.append(piece)


def _partial_suffix(text: str, marker: str) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of ``marker``."""
    for n in range(min(len(marker) - 1, len(text)), 0, -1):
        if marker.startswith(text[-n:]):
            return n
    return 0
