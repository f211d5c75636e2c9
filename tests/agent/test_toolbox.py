"""Server-side tools: schemas from type hints, arguments checked against them, timeouts and
failures returned to the model as outputs (never raised), config errors that name the key."""

import asyncio
import json
import threading
from typing import Annotated, Literal

import msgspec
import pytest

from voicert.agent.toolbox import Toolbox, describe, load_function
from voicert.config import ConfigError, ToolsConfig
from voicert.core.chat import ToolCall


def book_table(
    people: Annotated[int, msgspec.Meta(ge=1, le=12, description="guests")],
    time: str,
    area: Literal["inside", "terrace"] = "inside",
) -> dict:
    """Book a table.

    Longer notes that are not the description."""
    return {"booked": True, "people": people, "time": time, "area": area}


async def slow(seconds: float) -> str:
    """Wait."""
    await asyncio.sleep(seconds)
    return "done"


def fails() -> str:
    raise RuntimeError("the kitchen is on fire")


def on_thread() -> str:
    return threading.current_thread().name


def test_a_schema_comes_from_the_type_hints_and_the_docstring():
    spec = describe(book_table).spec
    assert spec.name == "book_table" and spec.description == "Book a table."
    assert spec.schema == {
        "type": "object",
        "additionalProperties": False,
        "required": ["people", "time"],
        "properties": {
            "people": {"type": "integer", "minimum": 1, "maximum": 12, "description": "guests"},
            "time": {"type": "string"},
            "area": {"enum": ["inside", "terrace"], "default": "inside"},
        },
    }


def test_star_args_cannot_be_a_tool():
    def f(*args: int) -> None: ...

    with pytest.raises(TypeError, match="keyword"):
        describe(f)


async def test_a_call_gets_typed_arguments_and_its_result_as_json():
    box = Toolbox([describe(book_table)])
    out = await box.run(ToolCall("c1", "book_table", '{"people": 4, "time": "19:30"}'))
    assert not out.error and json.loads(out.output) == {
        "booked": True,
        "people": 4,
        "time": "19:30",
        "area": "inside",
    }


async def test_bad_arguments_an_unknown_tool_and_a_failing_tool_are_error_outputs():
    box = Toolbox([describe(book_table), describe(fails)])
    for call, words in (
        (ToolCall("a", "book_table", '{"people": 40, "time": "x"}'), "<= 12"),
        (ToolCall("b", "nope", "{}"), "no tool named"),
        (ToolCall("c", "fails", "{}"), "kitchen is on fire"),
    ):
        out = await box.run(call)
        assert (
            out.error and words in json.loads(out.output)["error"] and out.call_id == call.call_id
        )


async def test_a_tool_past_its_timeout_is_an_error_output():
    box = Toolbox([describe(slow)], timeout_s=0.01)
    out = await box.run(ToolCall("s", "slow", '{"seconds": 30}'))
    assert out.error and "timed out" in out.output


async def test_a_plain_function_runs_off_the_event_loop():
    out = await Toolbox([describe(on_thread)]).run(ToolCall("t", "on_thread", "{}"))
    assert out.output != threading.current_thread().name


def test_config_names_the_key_for_a_bad_reference_or_an_import_failure():
    with pytest.raises(ConfigError, match="tools.functions"):
        ToolsConfig(functions=["no colon"])
    with pytest.raises(ConfigError, match="tools.functions.*cannot import"):
        load_function("voicert_no_such_module:f")
    with pytest.raises(ConfigError, match="tools.functions.*no function"):
        load_function("json:no_such_function")
    box = Toolbox.from_config(ToolsConfig(functions=["tests.agent.test_toolbox:book_table"]))
    assert box.names == {"book_table"}


def test_the_tools_loaded_from_the_config_are_logged_once(caplog):
    with caplog.at_level("INFO", logger="voicert.agent.toolbox"):
        Toolbox.from_config(ToolsConfig(functions=["tests.agent.test_toolbox:book_table"]))
        Toolbox.from_config(ToolsConfig())  # none: nothing to say
    assert [r.getMessage() for r in caplog.records] == ["tools: book_table (tools.functions)"]
