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
from collections.abc import Iterator
from dataclasses import dataclass

from voicert.core.chat import ChatMessage, ToolCall


class Role(enum.StrEnum):
    SYSTEM = "system"
    USER = "user"
    ASSISTANT = "assistant"
    TOOL = "tool"  # a function call's output


class ItemKind(enum.StrEnum):
    MESSAGE = "message"
    FUNCTION_CALL = "function_call"  # the assistant called a tool (text: its arguments' JSON)
    FUNCTION_CALL_OUTPUT = "function_call_output"  # what the call returned (text: the output)


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
    kind: ItemKind = ItemKind.MESSAGE
    call_id: str = ""  # function_call and function_call_output: the call
    name: str = ""  # function_call: the tool

    def message(self) -> ChatMessage:
        return ChatMessage(self.role.value, self.text)

    @property
    def call(self) -> ToolCall:
        return ToolCall(self.call_id, self.name, self.text)


class Conversation:
    def __init__(
        self,
        max_items: int = 200,
        max_text_chars: int = 16000,
        max_chars: int | None = None,
        id_prefix: str = "item",
    ) -> None:
        self.max_items = max_items
        self.max_text_chars = max_text_chars
        self.max_chars = max_chars if max_chars is not None else 8 * max_text_chars
        self._items: collections.deque[Item] = collections.deque()
        self._chars = 0
        self._ids = itertools.count(1)
        self._prefix = id_prefix
        self.dropped = 0  # items dropped off the old end so far

    def new_id(self) -> str:
        """An item id no item of this conversation has (for an item announced before it is
        added, such as a tool call while it is decoded)."""
        return f"{self._prefix}_{next(self._ids)}"

    def check_text(self, text: str) -> None:
        """Raises TextTooLong if ``text`` could not be added."""
        if len(text) > self.max_text_chars:
            raise TextTooLong(len(text), self.max_text_chars)

    def add(self, role: Role | str, text: str, item_id: str | None = None) -> Item:
        """Append an item (an id is made if none is given). Raises TextTooLong; may drop the
        oldest items to stay within bounds."""
        self.check_text(text)
        return self._append(Item(item_id or self.new_id(), Role(role), text))

    def add_call(self, call: ToolCall, item_id: str | None = None) -> Item:
        """The assistant's call of a tool joins the conversation. Raises TextTooLong."""
        self.check_text(call.arguments)
        return self._append(
            Item(
                item_id or self.new_id(),
                Role.ASSISTANT,
                call.arguments,
                ItemKind.FUNCTION_CALL,
                call.call_id,
                call.name,
            )
        )

    def add_output(self, call_id: str, output: str, item_id: str | None = None) -> Item:
        """A call's output joins the conversation. Raises TextTooLong, or KeyError when no call
        with ``call_id`` is in it."""
        self.check_text(output)
        if not any(i.kind is ItemKind.FUNCTION_CALL and i.call_id == call_id for i in self._items):
            raise KeyError(call_id)
        return self._append(
            Item(
                item_id or self.new_id(), Role.TOOL, output, ItemKind.FUNCTION_CALL_OUTPUT, call_id
            )
        )

    def _append(self, item: Item) -> Item:
        self._items.append(item)
        self._chars += len(item.text)
        while len(self._items) > 1 and (
            len(self._items) > self.max_items or self._chars > self.max_chars
        ):
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
            if item.role is not Role.ASSISTANT or item.kind is not ItemKind.MESSAGE:
                raise ValueError(
                    f"item {item_id!r} is a {item.role.value} {item.kind.value} item;"
                    " only assistant messages are truncated"
                )
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
        """The conversation as the engine takes it: an assistant message and the calls right
        after it are one message (calls alone: one with no text); each output is a tool
        message."""
        out: list[ChatMessage] = []
        for item in self._items:
            if item.kind is ItemKind.FUNCTION_CALL:
                last = out[-1] if out else None
                if last is not None and last.role == "assistant":
                    out[-1] = ChatMessage("assistant", last.content, (*last.tool_calls, item.call))
                else:
                    out.append(ChatMessage("assistant", "", (item.call,)))
            elif item.kind is ItemKind.FUNCTION_CALL_OUTPUT:
                out.append(ChatMessage("tool", item.text, tool_call_id=item.call_id))
            else:
                out.append(item.message())
        return out

    def pending_calls(self) -> list[Item]:
        """Function calls with no output yet, oldest first."""
        answered = {i.call_id for i in self._items if i.kind is ItemKind.FUNCTION_CALL_OUTPUT}
        return [
            i for i in self._items if i.kind is ItemKind.FUNCTION_CALL and i.call_id not in answered
        ]

    def __len__(self) -> int:
        return len(self._items)

    def __iter__(self) -> Iterator[Item]:
        return iter(self._items)

    @property
    def chars(self) -> int:
        return self._chars
