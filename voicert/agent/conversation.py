"""One session's conversation: typed items with ids, bounded.

The conversation is what the next reply is generated from (after the system prompt). It is kept
within bounds so that no client can grow a session without limit: at most ``max_items`` items and
``max_chars`` characters in all (the oldest items go first: a rolling window, as the engine would
drop them anyway to fit its context), and no single text longer than ``max_text_chars``
(:class:`TextTooLong`, which each door reports as a typed error). Pure: no I/O, no asyncio.
"""

from __future__ import annotations

import collections
import enum
import itertools
from dataclasses import dataclass
from typing import Iterator

from voicert.engine.base import ChatMessage


class Role(enum.StrEnum):
    SYSTEM = "system"
    USER = "user"
    ASSISTANT = "assistant"


class TextTooLong(ValueError):
    """A text over the per-message limit; nothing was added."""

    def __init__(self, chars: int, limit: int) -> None:
        super().__init__(f"text of {chars} characters is over the limit of {limit}")
        self.chars, self.limit = chars, limit


@dataclass(frozen=True, slots=True)
class Item:
    item_id: str
    role: Role
    text: str

    def message(self) -> ChatMessage:
        return ChatMessage(self.role.value, self.text)


class Conversation:
    def __init__(self, max_items: int = 200, max_text_chars: int = 16000,
                 max_chars: int | None = None, id_prefix: str = "item") -> None:
        self.max_items = max_items
        self.max_text_chars = max_text_chars
        self.max_chars = max_chars if max_chars is not None else 8 * max_text_chars
        self._items: collections.deque[Item] = collections.deque()
        self._chars = 0
        self._ids = itertools.count(1)
        self._prefix = id_prefix
        self.dropped = 0  # items dropped off the old end so far

    def check_text(self, text: str) -> None:
        """Raises TextTooLong if ``text`` could not be added."""
        if len(text) > self.max_text_chars:
            raise TextTooLong(len(text), self.max_text_chars)

    def add(self, role: Role | str, text: str, item_id: str | None = None) -> Item:
        """Append an item (an id is made if none is given). Raises TextTooLong; may drop the
        oldest items to stay within bounds."""
        self.check_text(text)
        item = Item(item_id or f"{self._prefix}_{next(self._ids)}", Role(role), text)
        self._items.append(item)
        self._chars += len(text)
        while len(self._items) > 1 and (len(self._items) > self.max_items
                                        or self._chars > self.max_chars):
            self._chars -= len(self._items.popleft().text)
            self.dropped += 1
        return item

    def find(self, item_id: str) -> Item | None:
        return next((item for item in self._items if item.item_id == item_id), None)

    def truncate(self, item_id: str, chars: int) -> Item:
        """Keep only the first ``chars`` characters of an assistant item (what the listener heard
        before an interruption). Raises KeyError for an unknown item, ValueError for another role
        or a negative length."""
        for i, item in enumerate(self._items):
            if item.item_id != item_id:
                continue
            if item.role is not Role.ASSISTANT:
                raise ValueError(f"item {item_id!r} is a {item.role.value} item; only assistant "
                                 "items are truncated")
            if chars < 0:
                raise ValueError("chars must be >= 0")
            cut = Item(item.item_id, item.role, item.text[:chars])
            self._items[i] = cut
            self._chars -= len(item.text) - len(cut.text)
            return cut
        raise KeyError(item_id)

    def delete(self, item_id: str) -> Item:
        """Remove an item. Raises KeyError for an unknown one."""
        item = self.find(item_id)
        if item is None:
            raise KeyError(item_id)
        self._items.remove(item)
        self._chars -= len(item.text)
        return item

    def messages(self) -> list[ChatMessage]:
        return [item.message() for item in self._items]

    def __len__(self) -> int:
        return len(self._items)

    def __iter__(self) -> Iterator[Item]:
        return iter(self._items)

    @property
    def chars(self) -> int:
        return self._chars
