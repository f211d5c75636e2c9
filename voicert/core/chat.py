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
        decode under (llguidance's own check: a dangling ``$ref``, an unknown type...; and
        :func:`unsatisfiable`: no finite arguments fit), so a door refuses it when it is declared
        rather than failing every reply that offers it."""
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
        except RecursionError:
            raise ToolSchemaError(f"tool {name}: parameters nested too deep") from None
        problem = unsatisfiable(schema) or _schema_problem(text)
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


MAX_SCHEMA_DEPTH = 64  # nesting of a tool schema (OpenAI's structured outputs allow 5)
_WALK_BUDGET = 1_000_000  # schema nodes visited in all by unsatisfiable()


class _TooBig(Exception):
    pass


def unsatisfiable(schema: dict) -> str:
    """Why no finite JSON value fits ``schema`` or a definition it points to, or "": a ``$ref``
    loop with nothing else to decode (``A -> B -> A``, even where only an optional property
    points to it), or a required property (or non-empty array) that must nest itself
    forever (``{"properties": {"next": {"$ref": "#"}}, "required": ["next"]}``). Recursive
    schemas with a way out (an optional property, ``anyOf`` with a leaf) are fine. A decode under
    either kind never ends (or never starts), so the tool is refused when it is declared. Also
    "" for pointers it cannot follow (llguidance names a dangling one). Raises nothing: a schema
    nested deeper than :data:`MAX_SCHEMA_DEPTH` or too large to check is itself the reason.

    The productive-symbol fixed point of a grammar: every local pointer starts unproven; a pass
    proves those whose target has a finite value given the ones proven so far; until a pass
    proves nothing new."""
    refs = sorted(_local_refs(schema))
    proven: set[str] = set()
    budget = [_WALK_BUDGET]
    try:
        while True:
            new = {
                r
                for r in refs
                if r not in proven
                and (t := _pointed(schema, r)) is not None
                and _finite(t, proven, budget)
            }
            if not new:
                break
            proven |= new
        whole = _finite(schema, proven, budget)
    except _TooBig as exc:
        return str(exc)
    looping = [r for r in refs if r not in proven and _pointed(schema, r) is not None]
    if whole and not looping:
        return ""
    where = f" ({', '.join(looping[:3])})" if looping else ""
    return f"no finite value fits this schema: it must nest itself forever{where}"


def _local_refs(node: object, depth: int = 0) -> set[str]:
    if depth > MAX_SCHEMA_DEPTH:
        return set()
    out: set[str] = set()
    if isinstance(node, dict):
        ref = node.get("$ref")
        if isinstance(ref, str) and ref.startswith("#"):
            out.add(ref)
        for v in node.values():
            out |= _local_refs(v, depth + 1)
    elif isinstance(node, list):
        for v in node:
            out |= _local_refs(v, depth + 1)
    return out


def _pointed(root: dict, ref: str) -> object | None:
    """The node a local JSON pointer (``#/$defs/A``) names, or None."""
    node: object = root
    for part in [p for p in ref[1:].split("/") if p]:
        part = part.replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return None
    return node


def _finite(node: object, proven: set[str], budget: list[int], depth: int = 0) -> bool:
    """Whether a finite value fits ``node``, where a ``$ref`` fits when it is ``proven`` (one
    it cannot follow counts as fitting)."""
    budget[0] -= 1
    if budget[0] < 0:
        raise _TooBig("tool schema too large to check")
    if depth > MAX_SCHEMA_DEPTH:
        raise _TooBig(f"tool schema nested deeper than {MAX_SCHEMA_DEPTH} levels")
    if not isinstance(node, dict):
        return node is not False
    ref = node.get("$ref")
    if isinstance(ref, str) and ref.startswith("#") and ref not in proven:
        return False

    def ok(sub: object) -> bool:
        return _finite(sub, proven, budget, depth + 1)

    if isinstance(all_of := node.get("allOf"), list) and not all(ok(s) for s in all_of):
        return False
    for key in ("anyOf", "oneOf"):
        if isinstance(alts := node.get(key), list) and alts and not any(ok(s) for s in alts):
            return False
    props = node.get("properties")
    required = node.get("required")
    if (
        isinstance(props, dict)
        and isinstance(required, list)
        and not all(ok(props[k]) for k in required if isinstance(k, str) and k in props)
    ):
        return False
    items, least = node.get("items"), node.get("minItems", 0)
    return not (isinstance(least, int) and least > 0 and isinstance(items, dict) and not ok(items))


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
