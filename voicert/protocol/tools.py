"""Tools and tool_choice as clients write them. Sans-I/O.

Three shapes of a tool are read, so any client's declaration works on every door:
the Realtime / Responses API's flat ``{"type": "function", "name", "description", "parameters"}``,
Chat Completions' nested ``{"type": "function", "function": {...}}``, and the native protocol's
``{"name", "description", "parameters"}``. tool_choice: ``"auto" | "none" | "required"``, or a
named function (``{"type": "function", "name": ...}``, or with ``function: {"name": ...}``).
"""

from __future__ import annotations

from typing import Any

from voicert.core.chat import ToolChoice, ToolChoiceMode, ToolSchemaError, ToolSpec

MAX_TOOLS = 64
MAX_SCHEMA_CHARS = 16000


class WireError(ValueError):
    """A tool or choice that cannot be read; ``param`` names the field (e.g. ``tools[2].name``)."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.param = param


def tools_from_wire(value: Any, where: str = "tools") -> tuple[ToolSpec, ...]:
    """Raises WireError naming the bad field."""
    if not isinstance(value, list):
        raise WireError(f"{where} must be a list", where)
    if len(value) > MAX_TOOLS:
        raise WireError(f"{where}: at most {MAX_TOOLS} tools", where)
    specs: list[ToolSpec] = []
    for i, tool in enumerate(value):
        at = f"{where}[{i}]"
        if not isinstance(tool, dict):
            raise WireError(f"{at} must be an object", at)
        kind = tool.get("type", "function")
        if kind != "function":
            raise WireError(
                f"{at}.type {str(kind)[:40]!r} is not supported (only function tools)", f"{at}.type"
            )
        function = tool.get("function")
        body: dict = function if isinstance(function, dict) else tool
        name, params = body.get("name"), body.get("parameters")
        description = body.get("description") or ""
        if not isinstance(description, str):
            raise WireError(f"{at}.description must be a string", f"{at}.description")
        if params is not None and not isinstance(params, dict):
            raise WireError(f"{at}.parameters must be a JSON schema object", f"{at}.parameters")
        if params is not None and len(repr(params)) > MAX_SCHEMA_CHARS:
            raise WireError(
                f"{at}.parameters is over {MAX_SCHEMA_CHARS} characters", f"{at}.parameters"
            )
        try:
            spec = ToolSpec.of(name, description, params)
        except ToolSchemaError as exc:
            raise WireError(f"{at}: {exc}", f"{at}.parameters") from None
        except ValueError as exc:
            raise WireError(f"{at}: {exc}", f"{at}.name") from None
        if any(s.name == spec.name for s in specs):
            raise WireError(f"{at}: two tools are named {spec.name!r}", f"{at}.name")
        specs.append(spec)
    return tuple(specs)


def choice_from_wire(value: Any, where: str = "tool_choice") -> ToolChoice:
    """Raises WireError."""
    if isinstance(value, str):
        if value not in ("auto", "none", "required"):
            raise WireError(f"{where} must be auto, none, required or a function", where)
        return ToolChoice(ToolChoiceMode(value))
    if isinstance(value, dict):
        function = value.get("function")
        body: dict = function if isinstance(function, dict) else value
        name = body.get("name")
        if value.get("type", "function") == "function" and isinstance(name, str) and name:
            return ToolChoice(ToolChoiceMode.NAMED, name)
    raise WireError(
        f'{where} must be auto, none, required or {{"type": "function", "name": ...}}', where
    )


def choice_to_wire(choice: ToolChoice) -> str | dict:
    """The Realtime API's shape of a choice."""
    if choice.mode is ToolChoiceMode.NAMED:
        return {"type": "function", "name": choice.name}
    return choice.mode.value


def tool_to_wire(spec: ToolSpec) -> dict:
    """The Realtime API's (flat) shape of a tool."""
    return {
        "type": "function",
        "name": spec.name,
        "description": spec.description,
        "parameters": spec.schema,
    }
