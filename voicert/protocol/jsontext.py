"""JSON from a client, read as the text it must be. A lone UTF-16 surrogate (``"\\ud800"``) is
legal JSON but no Unicode text: it cannot be encoded as UTF-8, so it cannot be tokenised, logged,
sent to a worker's engine host or echoed back. Every door reads client JSON through :func:`loads`,
which refuses it where it enters, as the parse error it nearly is."""

from __future__ import annotations

import json
import re
from typing import Any

# an escape that may be half of a surrogate pair (a whole pair decodes to one valid character)
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


class NotText(ValueError):
    """Valid JSON whose strings are not all Unicode text."""


def loads(data: str | bytes) -> Any:
    """``json.loads``, raising :class:`NotText` (a ValueError) when a string or a key holds a
    lone surrogate."""
    value = json.loads(data)
    text = data if isinstance(data, str) else data.decode("utf-8", "replace")
    if _SURROGATE_ESCAPE.search(text) and not _all_text(value):
        raise NotText("a string holds a lone surrogate (\\ud800-\\udfff), which is not text")
    return value


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
