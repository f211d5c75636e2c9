"""Tools as the engine sees them (the types are ``core/chat.py``'s): how a chat template writes a
call, and the grammar that holds a call's arguments to its tool's JSON schema while it is decoded.

Torch-free and I/O-free. The agent declares :class:`ToolSpec` s and a :class:`ToolChoice` on a
:class:`~voicert.core.llm.GenerationRequest`; the engine renders them into the prompt (the chat
template's own tool support when it has one, else :func:`hermes_system_block`) and decodes under
:func:`call_grammar` (llguidance Lark, applied as token masks: see ``engine/core/guided.py``). The
reply's text is parsed back into calls by ``agent/tool_calls.py``.
"""

from __future__ import annotations

import enum
import json
from typing import Any

from voicert.core.chat import ToolCall, ToolChoice, ToolChoiceMode, ToolSpec


class CallFormat(enum.StrEnum):
    """How a model family writes a tool call in its reply."""

    HERMES = "hermes"  # <tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call> (Qwen2.5,
    # Hermes, SmolLM2; the fallback for templates with no tool support)
    LLAMA3 = "llama3"  # the whole reply is {"name": ..., "parameters": {...}} (Llama 3.1-3.3)


HERMES_OPEN, HERMES_CLOSE = "<tool_call>", "</tool_call>"
# whitespace inside a call is fixed (no run of spaces a small model could loop on)
_JSON_STYLE = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
MAX_PARALLEL_CALLS = 4


def call_format(chat_template: str | None) -> CallFormat:
    """The format a chat template's tool support implies (HERMES when it has none)."""
    template = chat_template or ""
    if HERMES_OPEN in template:
        return CallFormat.HERMES
    if "tools" in template and '"parameters"' in template:
        return CallFormat.LLAMA3
    return CallFormat.HERMES


def template_supports_tools(chat_template: str | None) -> bool:
    """The template renders a ``tools`` list itself (else :func:`hermes_system_block` does)."""
    return "tools" in (chat_template or "")


def _call_schema(tool: ToolSpec, fmt: CallFormat, defs: dict[str, Any]) -> dict:
    """One call's schema: the tool's name and its arguments. A tool schema with ``$ref`` s is
    placed in ``defs`` (the call grammar's root ``$defs``; see :func:`_hoisted`) and referred to."""
    key = "parameters" if fmt is CallFormat.LLAMA3 else "arguments"
    args = tool.schema
    if '"$ref"' in tool.parameters:
        defs.update(_hoisted(tool.name, args))
        args = {"$ref": f"#/$defs/{tool.name}__root"}
    return {
        "type": "object",
        "properties": {"name": {"const": tool.name}, key: args},
        "required": ["name", key],
        "additionalProperties": False,
    }


def _calls_schema(tools: list[ToolSpec], fmt: CallFormat) -> str:
    defs: dict[str, Any] = {}
    schemas = [_call_schema(t, fmt, defs) for t in tools]
    schema = schemas[0] if len(schemas) == 1 else {"anyOf": schemas}
    if defs:
        schema = {**schema, "$defs": defs}
    return json.dumps({**schema, "x-guidance": _JSON_STYLE})


def _hoisted(tool: str, schema: dict) -> dict[str, Any]:
    """A tool schema whose ``$ref`` s point into it from its root ("#", "#/$defs/Address",
    "#/definitions/...", "#/properties/..."), as the call grammar's root definitions: the schema
    itself as ``{tool}__root`` and each of its definitions as ``{tool}__$defs__{name}``, every
    pointer rewritten to match. Nested under a call as it is, its pointers would resolve against
    the call's root and miss (pydantic's and msgspec's schemas of nested types have them)."""
    root = dict(schema)
    defs: dict[str, Any] = {}
    for section in ("$defs", "definitions"):
        for name, sub in (root.pop(section, None) or {}).items():
            defs[f"{tool}__{section}__{name}"] = _repointed(tool, sub)
    defs[f"{tool}__root"] = _repointed(tool, root)
    return defs


def _repointed(tool: str, value: Any) -> Any:
    """``value`` with every local ``$ref`` moved to where :func:`_hoisted` puts its target."""
    if isinstance(value, list):
        return [_repointed(tool, v) for v in value]
    if not isinstance(value, dict):
        return value
    out = {k: _repointed(tool, v) for k, v in value.items()}
    ref = value.get("$ref")
    if isinstance(ref, str) and ref.startswith("#"):
        path = ref[1:].lstrip("/")
        head, sep, rest = path.partition("/")
        if head in ("$defs", "definitions") and sep:  # (a definition may be named "")
            name, _, tail = rest.partition("/")
            target = f"{tool}__{head}__{name}" + (f"/{tail}" if tail else "")
        else:
            target = f"{tool}__root" + (f"/{path}" if path else "")
        out["$ref"] = f"#/$defs/{target}"
    return out


def offered(tools: tuple[ToolSpec, ...], choice: ToolChoice) -> list[ToolSpec]:
    """The tools the model may call under ``choice``. Raises ValueError for a named tool that is
    not among ``tools``."""
    if choice.mode is ToolChoiceMode.NONE:
        return []
    if choice.mode is ToolChoiceMode.NAMED:
        named = [t for t in tools if t.name == choice.name]
        if not named:
            raise ValueError(f"tool_choice names {choice.name!r}, which is not among the tools")
        return named
    return list(tools)


def call_grammar(
    tools: tuple[ToolSpec, ...], choice: ToolChoice, fmt: CallFormat, parallel: bool = True
) -> str | None:
    """The llguidance Lark grammar a reply is decoded under, or None (no tool may be called).

    AUTO: free text, or (HERMES) free text then calls, each call's JSON held to its tool's schema
    from the moment ``<tool_call>`` appears; (LLAMA3) a reply that opens with ``{`` is a call.
    REQUIRED / NAMED: calls only. ``parallel``: up to :data:`MAX_PARALLEL_CALLS` calls, else one.
    After the last call only the end of the reply may follow."""
    tools_ = offered(tools, choice)
    if not tools_:
        return None
    calls = MAX_PARALLEL_CALLS if parallel else 1
    body = f"%json {_calls_schema(tools_, fmt)}"
    free = choice.mode is ToolChoiceMode.AUTO
    lines = ["%llguidance {}"]
    if fmt is CallFormat.LLAMA3:
        lines.append("start: call" + (" | TEXT" if free else ""))
        lines.append(f"call: {body}")
        lines.append("TEXT: /[^{](.|\\n)*/")
        return "\n".join(lines) + "\n"
    more = "".join(f' ("\\n{HERMES_OPEN}" body' for _ in range(calls - 1)) + ")?" * (calls - 1)
    if free:
        lines.append(f"start: TEXT | pre body{more}")
        lines.append(f'pre[lazy]: TEXT "{HERMES_OPEN}"')
    else:
        lines.append(f'start: "{HERMES_OPEN}" body{more}')
    lines.append(f'body: "\\n" {body} "\\n{HERMES_CLOSE}"')
    # a reply may not open with a bare JSON object or a code fence: a model that reaches for one
    # wants to call, and is steered into the call's own syntax instead
    lines.append("TEXT: /([^`{](.|\\n)*)?/")
    return "\n".join(lines) + "\n"


def hermes_system_block(tools: list[ToolSpec]) -> str:
    """What a system prompt gains when the chat template cannot show tools itself (the Hermes
    function-calling convention, which Qwen2.5 and SmolLM2 were tuned on)."""
    listed = "\n".join(json.dumps(t.openai(), sort_keys=True) for t in tools)
    return (
        "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
        "You are provided with function signatures within <tools></tools> XML tags:\n"
        f"<tools>\n{listed}\n</tools>\n\n"
        "For each function call, return a json object with function name and arguments "
        "within <tool_call></tool_call> XML tags:\n"
        '<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n'
        "</tool_call>"
    )


def hermes_call_text(calls: tuple[ToolCall, ...]) -> str:
    """An assistant's calls written as the HERMES format writes them."""
    return "\n".join(
        f'{HERMES_OPEN}\n{{"name": {json.dumps(c.name)}, "arguments": '
        f"{c.arguments}}}\n{HERMES_CLOSE}"
        for c in calls
    )


def template_message(
    role: str, content: str, calls: tuple[ToolCall, ...], call_id: str, native: bool
) -> dict[str, Any]:
    """One message as a chat template takes it. ``native``: the template renders tool calls and
    tool results itself; else they are written into the text (HERMES)."""
    if role == "assistant" and calls:
        if native:
            return {
                "role": "assistant",
                "content": content,
                "tool_calls": [c.openai() for c in calls],
            }
        text = hermes_call_text(calls)
        return {"role": "assistant", "content": f"{content}\n{text}" if content else text}
    if role == "tool":
        if native:
            return {"role": "tool", "content": content, "tool_call_id": call_id}
        return {"role": "tool", "content": f"<tool_response>\n{content}\n</tool_response>"}
    return {"role": role, "content": content}
