"""The tools the server runs itself: Python callables named in config (``tools.functions``).

Each callable's JSON schema is made from its signature by msgspec (type hints, defaults,
``Annotated[..., msgspec.Meta(description=...)]``), its description from its docstring. A call's
arguments are decoded against the same types (so a function gets what its hints promise), it runs
with a timeout (a plain function on a worker thread, a coroutine function on the loop), and its
return value becomes the output text the model reads next: a string as is, anything else as JSON.
A failure or a timeout is an output too (``{"error": ...}``), so the model can say so.
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import msgspec

from voicert.config import ConfigError, ToolsConfig
from voicert.core.chat import ToolCall, ToolSpec

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ToolOutcome:
    call_id: str
    output: str
    error: bool
    seconds: float


@dataclass(frozen=True, slots=True)
class Tool:
    spec: ToolSpec
    fn: Callable[..., Any]
    args_type: type  # a msgspec Struct of the parameters: decodes and checks a call's arguments


def describe(fn: Callable[..., Any], name: str | None = None) -> Tool:
    """A tool from a callable. Raises TypeError for a signature msgspec cannot describe
    (``*args``, ``**kwargs``, a parameter type with no JSON schema)."""
    sig = inspect.signature(fn)
    hints = _hints(fn)
    fields = []
    for pname, param in sig.parameters.items():
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD, param.POSITIONAL_ONLY):
            raise TypeError(f"{fn.__qualname__}: parameter {pname} must be passable by keyword")
        typ = hints.get(pname, Any)
        fields.append((pname, typ) if param.default is param.empty else (pname, typ, param.default))
    args_type = msgspec.defstruct(
        f"{fn.__name__}_args", fields, forbid_unknown_fields=True, kw_only=True
    )
    (schema,), defs = msgspec.json.schema_components([args_type], ref_template="#/$defs/{name}")
    params = dict(defs.pop(schema["$ref"].rsplit("/", 1)[1]))
    params.pop("title", None)
    params.setdefault("properties", {})
    params["additionalProperties"] = False
    if defs:
        params["$defs"] = defs
    doc = inspect.getdoc(fn) or ""
    description = doc.split("\n\n")[0].replace("\n", " ").strip()
    return Tool(ToolSpec.of(name or fn.__name__, description, params), fn, args_type)


def _hints(fn: Callable[..., Any]) -> dict[str, Any]:
    import typing

    try:
        return typing.get_type_hints(fn, include_extras=True)
    except Exception as exc:  # an annotation that does not resolve
        raise TypeError(f"{fn.__qualname__}: type hints do not resolve ({exc})") from None


def load_function(ref: str) -> Callable[..., Any]:
    """``module:function`` or ``path/to/file.py:function`` -> the callable. Raises ConfigError
    naming ``tools.functions``."""
    mod_name, _, fn_name = ref.rpartition(":")
    try:
        module = (
            _load_file(mod_name) if mod_name.endswith(".py") else importlib.import_module(mod_name)
        )
    except Exception as exc:
        raise ConfigError(f"config tools.functions: cannot import {mod_name!r} ({exc})") from None
    fn = getattr(module, fn_name, None)
    if not callable(fn):
        raise ConfigError(f"config tools.functions: {mod_name} has no function {fn_name!r}")
    return fn


def _load_file(path: str):
    """A module from a .py file (each file loaded once per process, under a name of its own)."""
    import importlib.util
    import sys
    from pathlib import Path

    file = Path(path).expanduser().resolve()
    name = f"voicert_tools_{abs(hash(str(file))):x}"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, file)
    if spec is None or spec.loader is None or not file.is_file():
        raise FileNotFoundError(f"no file {file}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # before running it: dataclasses look their module up
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module


class Toolbox:
    """The server-side tools. Contract: :meth:`run` never raises for a tool's own failure; it
    returns an error outcome. Thread-safe to share between sessions (it holds no call state)."""

    def __init__(self, tools: list[Tool], timeout_s: float = 10.0) -> None:
        self.tools = {t.spec.name: t for t in tools}
        if len(self.tools) != len(tools):
            raise ConfigError("config tools.functions: two tools have the same name")
        self.timeout_s = timeout_s

    @classmethod
    def from_config(cls, cfg: ToolsConfig) -> Toolbox:
        tools = []
        for ref in cfg.functions:
            try:
                tools.append(describe(load_function(ref)))
            except (TypeError, ValueError) as exc:
                if isinstance(exc, ConfigError):
                    raise
                raise ConfigError(f"config tools.functions: {ref}: {exc}") from None
        if tools:  # what the model will be offered, said once at start-up
            log.info("tools: %s (tools.functions)", ", ".join(t.spec.name for t in tools))
        return cls(tools, cfg.timeout_s)

    @property
    def specs(self) -> tuple[ToolSpec, ...]:
        return tuple(t.spec for t in self.tools.values())

    @property
    def names(self) -> frozenset[str]:
        return frozenset(self.tools)

    async def run(self, call: ToolCall) -> ToolOutcome:
        t0 = time.perf_counter_ns()
        tool = self.tools.get(call.name)
        try:
            if tool is None:
                raise LookupError(f"no tool named {call.name!r}")
            try:
                args: Any = msgspec.json.decode(call.arguments, type=tool.args_type)
            except msgspec.ValidationError as exc:
                raise ValueError(f"bad arguments: {exc}") from None
            kwargs = {f: getattr(args, f) for f in args.__struct_fields__}
            result = await asyncio.wait_for(self._invoke(tool.fn, kwargs), self.timeout_s)
            output, error = _as_text(result), False
        except TimeoutError:
            output, error = (
                json.dumps({"error": f"{call.name} timed out after {self.timeout_s:g} s"}),
                True,
            )
        except Exception as exc:  # the tool's own failure: the model is told, the session lives
            log.warning("tool %s failed: %s", call.name, exc)
            output, error = json.dumps({"error": f"{type(exc).__name__}: {exc}"[:500]}), True
        return ToolOutcome(call.call_id, output, error, (time.perf_counter_ns() - t0) / 1e9)

    @staticmethod
    async def _invoke(fn: Callable[..., Any], kwargs: dict[str, Any]) -> Any:
        if inspect.iscoroutinefunction(fn):
            return await fn(**kwargs)
        return await asyncio.to_thread(fn, **kwargs)  # never on the event loop


def _as_text(result: Any) -> str:
    if isinstance(result, str):
        return result
    return msgspec.json.encode(result).decode()
