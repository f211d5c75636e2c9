"""Prompts and stop tokens from a model's tokenizer and chat template."""

from __future__ import annotations

import collections
import re

from voicert.core.chat import ChatMessage, ToolSpec
from voicert.engine.core.tools import (
    call_format,
    hermes_system_block,
    template_message,
    template_supports_tools,
)

_MARK_OPEN, _MARK_CLOSE = "\ue000", "\ue001"  # private-use characters: no template writes them
_MARKS = re.compile(f"{_MARK_OPEN}(\\d+){_MARK_CLOSE}")


def stop_token_ids(tokenizer, model_config) -> set[int]:
    """Ids that end a reply: the tokenizer's EOS, the generation config's EOS, and the usual
    end-of-turn markers of chat templates when the vocabulary has them."""
    ids: set[int] = set()
    for value in (tokenizer.eos_token_id, getattr(model_config, "eos_token_id", None)):
        if isinstance(value, int):
            ids.add(value)
        elif isinstance(value, (list, tuple)):
            ids.update(v for v in value if isinstance(v, int))
    vocab = tokenizer.get_vocab()
    for marker in ("<|im_end|>", "<|eot_id|>", "<|end|>", "<end_of_turn>", "<|endoftext|>"):
        if marker in vocab:
            ids.add(vocab[marker])
    return ids


class PromptBuilder:
    """Chat-templates a conversation into prompt ids that fit a token budget, dropping the oldest
    non-system turns. The result is the longest suffix of the conversation that fits (the system
    prompt always stays, and so does the last message, cut from the front if it alone is too long).

    Cost per call: each message's token count is computed once and cached (by role and text), the
    number of turns to keep is estimated from those counts, and the template is rendered about twice
    around that estimate, never once per dropped turn. So a call is linear in the new text plus the
    budget, however long the history; the engine thread never re-templates a long history over and
    over. Not thread-safe: one builder per thread that builds prompts."""

    def __init__(self, tokenizer, cache_entries: int = 8192) -> None:
        self.tok = tokenizer
        self._costs: collections.OrderedDict[ChatMessage, int] = collections.OrderedDict()
        self._max = cache_entries
        self._overhead: int | None = None  # template tokens around one message (measured once)
        template = getattr(tokenizer, "chat_template", None)
        self.native_tools = template_supports_tools(template)  # else: hermes_system_block
        self.call_format = call_format(template)
        self._tools: list[ToolSpec] = []  # offered to the build in progress
        self._open = False  # the build in progress leaves the last message open (no reply header)
        # the control tokens' texts ("<|im_start|>"...): in a message they are text, not control
        added = getattr(tokenizer, "added_tokens_decoder", None) or {}
        self._control = tuple(t.content for t in added.values() if getattr(t, "special", False))

    def _render(self, msgs: list[ChatMessage]) -> list[int]:
        tools, native = self._tools, self.native_tools
        if tools and not native:  # the tools go into the system prompt, in the Hermes convention
            block = hermes_system_block(tools)
            msgs = (
                [ChatMessage("system", msgs[0].content + block), *msgs[1:]]
                if msgs and msgs[0].role == "system"
                else [ChatMessage("system", block.lstrip()), *msgs]
            )
        rendered = [
            template_message(m.role, m.content, m.tool_calls, m.tool_call_id, native) for m in msgs
        ]
        extra = {"tools": [t.openai() for t in tools]} if tools and native else {}
        if self._control and any(c in m["content"] for m in rendered for c in self._control):
            return self._render_literal(rendered, extra)
        ids = self.tok.apply_chat_template(
            rendered,
            add_generation_prompt=not self._open,
            tokenize=True,
            return_dict=False,
            **extra,
        )
        if hasattr(ids, "keys"):
            ids = ids["input_ids"]
        return list(ids)

    def _render_literal(self, rendered: list[dict], extra: dict) -> list[int]:
        """The template's ids, each message's content tokenised as plain text: a control token's
        text in a message ("<|im_start|>system ...", a forged turn) becomes the tokens of those
        characters, never the control token. The template is rendered with a marker in place of
        each content; the text between markers is the template's own, control tokens and all."""
        marked = [{**m, "content": f"{_MARK_OPEN}{i}{_MARK_CLOSE}"} for i, m in enumerate(rendered)]
        text = self.tok.apply_chat_template(
            marked, add_generation_prompt=not self._open, tokenize=False, **extra
        )
        parts = _MARKS.split(text)
        if parts[1::2] != [str(i) for i in range(len(rendered))]:  # a marker in a tool's text
            raise ValueError("the prompt holds the private-use characters U+E000 / U+E001")
        ids: list[int] = []
        for k, part in enumerate(parts):
            if k % 2 == 0:  # the template's text
                ids += self.tok(part, add_special_tokens=False)["input_ids"]
            else:  # a message's content
                content = rendered[int(part)]["content"]
                ids += self.tok(content, add_special_tokens=False, split_special_tokens=True)[
                    "input_ids"
                ]
        return ids

    def _cost(self, m: ChatMessage) -> int:
        """Tokens ``m`` adds to a prompt, estimated: its text's tokens plus the template's."""
        if self._overhead is None:
            probe = ChatMessage("user", "hello")
            one, two = self._render([probe]), self._render([probe, probe])
            self._overhead = max(len(two) - len(one) - len(self._text_tokens(probe)), 0)
        key = m
        cost = self._costs.get(key)
        if cost is None:
            cost = (
                len(self._text_tokens(m))
                + self._overhead
                + sum(
                    len(self.tok.encode(c.arguments, add_special_tokens=False)) + 16
                    for c in m.tool_calls
                )
            )
            self._costs[key] = cost
            if len(self._costs) > self._max:
                self._costs.popitem(last=False)
        else:
            self._costs.move_to_end(key)
        return cost

    def _text_tokens(self, m: ChatMessage) -> list[int]:
        return self.tok.encode(m.content, add_special_tokens=False)

    def build(
        self, messages: list[ChatMessage], budget: int, tools: list[ToolSpec] | None = None
    ) -> list[int]:
        """The prompt ids (see the class doc). ``tools``: the functions offered to the model, shown
        as the template shows them (or in the system prompt, when it cannot)."""
        self._tools = list(tools or ())
        try:
            return self._build(messages, budget)
        finally:
            self._tools = []

    def build_open(
        self, messages: list[ChatMessage], budget: int, end_ids: set[int]
    ) -> tuple[list[int], int]:
        """The prompt of a conversation whose last message is still being spoken: templated as
        :meth:`build` does (within ``budget``), but cut just before the end-of-message token that
        closes the last message, and with no reply header. Returns (ids, that token's id): the
        model's probability of that token next is its belief that the message is complete.
        ``end_ids``: the template's end-of-message tokens (the engine's stop ids). Raises
        ValueError when the rendered prompt holds none of them."""
        self._open = True
        try:
            ids = self._build(messages, budget)
        finally:
            self._open = False
        at = next((i for i in range(len(ids) - 1, -1, -1) if ids[i] in end_ids), None)
        if at is None:
            raise ValueError("the chat template closes messages with no end-of-message token")
        return ids[:at], ids[at]

    def _build(self, messages: list[ChatMessage], budget: int) -> list[int]:
        first = 1 if messages and messages[0].role == "system" else 0
        head, turns = list(messages[:first]), list(messages[first:])
        if not turns:
            return self._render(head)[-budget:]
        # estimate: the most recent turns whose counted tokens fit
        left = budget - sum(self._cost(m) for m in head)
        guess = 0
        while guess < len(turns) and left - self._cost(turns[-1 - guess]) >= 0:
            left -= self._cost(turns[-1 - guess])
            guess += 1
        fits: dict[int, list[int] | None] = {}

        def fit(k: int) -> bool:
            if k not in fits:
                ids = self._render(head + turns[-k:])
                fits[k] = ids if len(ids) <= budget else None
            return fits[k] is not None

        # the exact answer, the largest k with fit(k) (monotone: more turns, more tokens), found
        # by galloping from the guess and bisecting: O(log(guess error)) renders
        lo, hi = 0, len(turns) + 1  # fit(lo) holds (0: trivially), fit(hi) does not
        k, step = min(max(guess, 1), len(turns)), 1
        while lo + 1 < hi:
            if fit(k):
                lo, k = k, min(k + step, hi - 1)
            else:
                hi, k = k, max(k - step, lo + 1)
            step *= 2
            if lo + 1 < hi and (k <= lo or k >= hi):
                k = (lo + hi) // 2
        if lo == 0:  # even the last message alone is too long: cut it from the front
            return self._render(head + turns[-1:])[-budget:]
        kept = turns[-lo:]
        orphans = next((i for i, m in enumerate(kept) if m.role != "tool"), len(kept) - 1)
        if orphans:  # tool outputs whose call was dropped: they go too (fewer tokens: it fits)
            return self._render(head + kept[orphans:])
        ids = fits[lo]
        assert ids is not None  # lo turns were measured and fit
        return ids


def build_prompt(tokenizer, messages: list[ChatMessage], budget: int) -> list[int]:
    """Chat-template ``messages`` into ids, dropping the oldest non-system turns until the prompt
    fits in ``budget`` tokens. The system prompt and the last user message always stay.
    (A one-off :class:`PromptBuilder`; engines keep one, whose token counts carry over.)"""
    return PromptBuilder(tokenizer).build(messages, budget)
