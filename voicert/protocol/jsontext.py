"""JSON from a client, read as the text it must be. A lone UTF-16 surrogate (``"\\ud800"``) is
legal JSON but no Unicode text: it cannot be encoded as UTF-8, so it cannot be tokenised, logged,
sent to a worker's engine host or echoed back. Every door reads client JSON through :func:`loads`,
which refuses it where it enters, as the parse error it nearly is.

So are values no part of the server can hold: numbers beyond a 64-bit integer or a finite float
(``1e400`` parses as infinity, which no count, rate or position takes: ``int(inf)`` raised
OverflowError deep in a door), ``NaN`` and ``Infinity``, and nesting deeper than
:data:`MAX_DEPTH` (a tool schema a thousand levels deep parsed, then every recursive walk of it
raised RecursionError). Each is a :class:`BadValue`, a ValueError, refused where it enters; the
binary codec checks its decoded values with :func:`check_value`."""

from __future__ import annotations

import json
import math
import re
from typing import Any

# an escape that may be half of a surrogate pair (a whole pair decodes to one valid character)
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


MAX_DEPTH = 64  # arrays and objects inside one another (a JSON Schema is a dozen deep)
MAX_INT = 2**63 - 1


class NotText(ValueError):
    """Valid JSON whose strings are not all Unicode text."""


class BadValue(ValueError):
    """Valid JSON (or msgpack) holding a number or a nesting no part of the server takes."""


def _float(literal: str) -> float:
    x = float(literal)
    if not math.isfinite(x):
        raise BadValue(f"the number {literal[:40]} is beyond a finite float")
    return x


def _int(literal: str) -> int:
    if len(literal) > 20 or abs(n := int(literal)) > MAX_INT:
        raise BadValue(f"the number {literal[:40]} is beyond a 64-bit integer")
    return n


def _constant(name: str) -> float:
    raise BadValue(f"{name} is not a JSON number")


def loads(data: str | bytes) -> Any:
    """``json.loads``, raising :class:`NotText` when a string or a key holds a lone surrogate,
    :class:`BadValue` for a number beyond what the server takes or nesting deeper than
    :data:`MAX_DEPTH` (both ValueErrors)."""
    # (nesting past the parser's own limit raises RecursionError: not JSON it can read, as before)
    value = json.loads(data, parse_float=_float, parse_int=_int, parse_constant=_constant)
    opens = (
        data.count("[") + data.count("{")
        if isinstance(data, str)
        else (data.count(b"[") + data.count(b"{"))
    )
    if opens > MAX_DEPTH:  # (a message with fewer cannot nest deeper)
        check_value(value)
    text = data if isinstance(data, str) else data.decode("utf-8", "replace")
    if _SURROGATE_ESCAPE.search(text) and not _all_text(value):
        raise NotText("a string holds a lone surrogate (\\ud800-\\udfff), which is not text")
    return value


def check_value(value: Any, max_depth: int = MAX_DEPTH) -> None:
    """Raise :class:`BadValue` for nesting deeper than ``max_depth`` or a number beyond a 64-bit
    integer or a finite float, anywhere in a decoded value (walked without recursion)."""
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict | list):
            if depth >= max_depth:
                raise BadValue(f"nested deeper than {max_depth} levels")
            items = item.values() if isinstance(item, dict) else item
            stack.extend((v, depth + 1) for v in items)
        elif isinstance(item, float) and not math.isfinite(item):
            raise BadValue("a number is not finite")
        elif isinstance(item, int) and not isinstance(item, bool) and abs(item) > MAX_INT:
            raise BadValue("a number is beyond a 64-bit integer")


def _all_text(value: Any) -> bool:
    """Every string and key in a decoded JSON value is encodable Unicode (walked without
    recursion: nesting as deep as the parser allowed)."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            if not _encodable(item):
                return False
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return True


def _encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True
