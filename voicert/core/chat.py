"""The words of a conversation that every part shares: messages, the tools a model may call, a
call it made, and the caller's choice among the tools.

The contract floor: standard library only. Doors decode their wire formats into these types
(``protocol/``), the session keeps its history in them (``agent/``), and the engine renders them
into a prompt and decodes calls under a grammar (``engine/core/tools.py``).
"""

from __future__ import annotations

import collections
import enum
import hashlib
import json
import threading
from dataclasses import dataclass

ROLES = ("system", "user", "assistant", "tool")


class ToolSchemaError(ValueError):
    """A tool's parameters are not a JSON schema the engine can decode a call under."""


class ToolChoiceMode(enum.StrEnum):
    AUTO = "auto"  # the model decides: text, or calls
    NONE = "none"  # no call: the tools are not offered
    REQUIRED = "required"  # at least one call, and nothing else
    NAMED = "named"  # exactly a call of ``ToolChoice.name``


@dataclass(frozen=True, slots=True)
class ToolChoice:
    mode: ToolChoiceMode = ToolChoiceMode.AUTO
    name: str = ""  # the tool, with NAMED

    def __post_init__(self) -> None:
        if (self.mode is ToolChoiceMode.NAMED) != bool(self.name):
            raise ValueError("a named tool choice needs a name, and only it")


AUTO = ToolChoice()


@dataclass(frozen=True, slots=True)
class ToolSpec:
    """One function the model may call. ``parameters`` is its JSON schema, as canonical JSON text
    (so specs are hashable and a prompt that offers them renders byte-identically every turn)."""

    name: str
    description: str = ""
    parameters: str = '{"type": "object", "properties": {}}'

    @classmethod
    def of(cls, name: object, description: str = "", parameters: dict | None = None) -> ToolSpec:
        """``name`` as a client sent it (any type). Raises ValueError for a name that a call
        could not carry, a schema that is not an object schema, or one the engine could not
        decode under (llguidance's own check: a dangling ``$ref``, an unknown type...), so a door
        refuses it when it is declared rather than failing every reply that offers it."""
        if (
            not name
            or not isinstance(name, str)
            or len(name) > 64
            or not all(c.isalnum() or c in "_-" for c in name)
        ):
            raise ValueError(f"tool name {name!r:.70} must be 1-64 letters, digits, _ or -")
        schema = {"type": "object", "properties": {}} if parameters is None else parameters
        if not isinstance(schema, dict) or schema.get("type", "object") != "object":
            raise ToolSchemaError(f"tool {name}: parameters must be a JSON schema of type object")
        try:  # a schema is JSON: not bytes (msgpack bin), NaN or other Python values
            text = json.dumps(schema, sort_keys=True, allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise ToolSchemaError(f"tool {name}: parameters are not JSON ({exc})") from None
        problem = _schema_problem(text)
        if problem:
            raise ToolSchemaError(f"tool {name}: parameters: {problem[:300]}")
        return cls(name, description or "", text)

    @property
    def schema(self) -> dict:
        return json.loads(self.parameters)

    def openai(self) -> dict:
        """The OpenAI / Hugging Face chat-template shape of this tool."""
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": self.schema,
            },
        }


_CHECKED: collections.OrderedDict[bytes, str] = collections.OrderedDict()  # sha256 -> problem
_CHECKED_MAX = 4096
_CHECKED_LOCK = threading.Lock()


def _schema_problem(schema_json: str) -> str:
    """Why llguidance cannot decode under a JSON schema, or "". The floor's one call outside the
    standard library, made lazily (llguidance is a dependency of every install): the grammar
    check belongs with the engine's grammar, and moves there with the off-loop check of tool
    sets ("Hostile input, round two", item 5). Answers are kept by the schema's digest (the
    4,096 latest): a client that sends the same tools with every request pays for one check."""
    key = hashlib.sha256(schema_json.encode()).digest()
    with _CHECKED_LOCK:
        if (known := _CHECKED.get(key)) is not None:
            _CHECKED.move_to_end(key)
            return known
    import llguidance

    try:
        problem = llguidance.LLMatcher.validate_grammar(
            llguidance.LLMatcher.grammar_from_json_schema(schema_json)
        )
    except Exception as exc:
        problem = str(exc)
    with _CHECKED_LOCK:
        _CHECKED[key] = problem
        if len(_CHECKED) > _CHECKED_MAX:
            _CHECKED.popitem(last=False)
    return problem


@dataclass(frozen=True, slots=True)
class ToolCall:
    """One call the model made: ``arguments`` is JSON text of an object."""

    call_id: str
    name: str
    arguments: str

    def openai(self) -> dict:
        return {
            "id": self.call_id,
            "type": "function",
            "function": {"name": self.name, "arguments": json.loads(self.arguments)},
        }


@dataclass(frozen=True, slots=True)
class ChatMessage:
    role: str  # one of ROLES: system | user | assistant | tool
    content: str
    tool_calls: tuple[
        ToolCall, ...
    ] = ()  # an assistant's calls (its content: any text before them)
    tool_call_id: str = ""  # a tool message: the call it answers
