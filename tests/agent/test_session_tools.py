"""Tool calls in a session, on fake services (no models, no sleeping): server-side tools run and
the reply goes on with their outputs; a client's tool ends the reply until the client answers;
a filler covers slow tools; rounds are bounded; a repeated call is made once."""

from __future__ import annotations

import asyncio
import dataclasses
import json

from tests.agent.fakes import EnergyVad, FakeAsr, FakeEngine
from tests.agent.test_session_logic import until
from voicert.agent.conversation import ItemKind
from voicert.agent.session import Services, Session
from voicert.agent.toolbox import Toolbox, describe
from voicert.config import Config
from voicert.core import events as ev
from voicert.core.chat import ToolChoice, ToolChoiceMode, ToolSpec
from voicert.protocol import native as p

GATE: asyncio.Event | None = None


def book_table(people: int, time: str) -> dict:
    """Book a table."""
    return {"booked": True, "people": people, "time": time}


async def slow_lookup(day: str) -> str:
    """Opening hours of a day."""
    await GATE.wait()
    return "noon to ten"


def call(name: str, **args) -> str:
    return f'<tool_call>\n{{"name": "{name}", "arguments": {json.dumps(args)}}}\n</tool_call>'


def make(script: list[str], start: p.SessionStart | None = None, **tools):
    cfg = Config()
    cfg = dataclasses.replace(cfg, tools=dataclasses.replace(cfg.tools, **tools))
    engine = FakeEngine(script=list(script))
    box = Toolbox([describe(book_table), describe(slow_lookup)])
    svc = Services(cfg=cfg, vad=EnergyVad(), asr=FakeAsr(), engine=engine, toolbox=box)
    events: list = []

    async def emit(event):
        events.append(event)

    return Session("s1", start or p.SessionStart(), svc, emit), engine, events


async def reply_to(session, text: str) -> None:
    session.add_user_text(text)
    session.respond()
    await session.wait_turn()


def of(events, kind):
    return [e for e in events if isinstance(e, kind)]


async def test_a_server_tool_runs_and_the_reply_goes_on_with_its_output():
    session, engine, events = make(
        [call("book_table", people=4, time="19:30"), "Booked for four at half seven."]
    )
    await reply_to(session, "a table for four at half seven")
    (started,) = of(events, ev.ToolCallStarted)
    (done,) = of(events, ev.ToolCallDone)
    (result,) = of(events, ev.ToolResult)
    assert started.name == done.name == "book_table" and done.runs_on_server
    assert "".join(e.delta for e in of(events, ev.ToolCallArguments)) == done.arguments
    assert json.loads(result.output) == {"booked": True, "people": 4, "time": "19:30"}
    assert len(of(events, ev.ReplyStarted)) == 1
    (final,) = of(events, ev.ReplyDone)
    assert final.text == "Booked for four at half seven." and final.calls == ()
    assert [i.kind for i in session.history] == [
        ItemKind.MESSAGE,
        ItemKind.FUNCTION_CALL,
        ItemKind.FUNCTION_CALL_OUTPUT,
        ItemKind.MESSAGE,
    ]
    assert session.history.find(done.item_id).name == "book_table"  # the announced item id
    first, second = engine.requests
    assert {t.name for t in first.tools} == {"book_table", "slow_lookup"}
    assert second.messages[-2].tool_calls[0].name == "book_table"
    assert second.messages[-1].role == "tool" and second.messages[-1].tool_call_id == done.call_id
    # no call text was ever sent as reply text
    assert "<tool_call>" not in "".join(e.text for e in of(events, ev.ReplyToken))


async def test_a_client_tool_ends_the_reply_until_its_output_comes_back():
    weather = ToolSpec.of(
        "weather", "Weather", {"type": "object", "properties": {"city": {"type": "string"}}}
    )
    session, engine, events = make(
        [f"Let me look. {call('weather', city='Paris')}", "It is sunny in Paris."],
        p.SessionStart(tools=(weather,)),
    )
    await reply_to(session, "weather in paris?")
    (done,) = of(events, ev.ToolCallDone)
    assert not done.runs_on_server and not of(events, ev.ToolResult)
    (reply,) = of(events, ev.ReplyDone)
    assert reply.calls == (done.call_id,) and reply.text == "Let me look."
    assert [c.call_id for c in session.waiting_calls()] == [done.call_id]
    session.add_tool_output(done.call_id, '{"sky": "sunny"}')
    assert not session.waiting_calls()
    session.respond()
    await session.wait_turn()
    assert of(events, ev.ReplyDone)[-1].text == "It is sunny in Paris."
    assert engine.requests[-1].messages[-1].content == '{"sky": "sunny"}'


async def test_a_slow_tool_gets_the_filler_said_before_its_output():
    global GATE
    GATE = asyncio.Event()
    session, _, events = make(
        [call("slow_lookup", day="sunday"), "Noon to ten."], filler="One moment.", filler_after_ms=0
    )
    session.add_user_text("when are you open on sunday")
    session.respond()
    await until(lambda: of(events, ev.ReplyToken))
    assert [e.text for e in of(events, ev.ReplyToken)] == ["One moment."]
    assert not of(events, ev.ToolResult)
    GATE.set()
    await session.wait_turn()
    assert of(events, ev.ReplyDone)[-1].text == "One moment. Noon to ten."


async def test_rounds_are_bounded_and_the_last_offers_no_tool():
    loops = [call("book_table", people=i, time="18:00") for i in range(1, 4)]
    session, engine, events = make([*loops, "Done."], max_rounds=2)
    await reply_to(session, "book")
    assert [len(r.tools) for r in engine.requests] == [2, 2, 0]
    assert len(of(events, ev.ToolResult)) == 2


async def test_a_forced_choice_applies_to_the_first_round_only():
    session, engine, _ = make([call("book_table", people=2, time="18:00"), "Booked."])
    session.respond(tool_choice=ToolChoice(ToolChoiceMode.NAMED, "book_table"))
    await session.wait_turn()
    assert [r.tool_choice.mode for r in engine.requests] == [
        ToolChoiceMode.NAMED,
        ToolChoiceMode.AUTO,
    ]


async def test_a_repeated_identical_call_is_made_once():
    twice = call("book_table", people=2, time="18:00")
    session, engine, events = make([f"{twice}\n{twice}\n{twice}", "Booked."])
    await reply_to(session, "book")
    assert len(of(events, ev.ToolCallStarted)) == 1 and len(of(events, ev.ToolResult)) == 1
    assert engine.requests[0].request_id in engine.cancelled  # the loop was stopped
    assert of(events, ev.ReplyDone)[-1].text == "Booked."  # and the reply went on


async def test_a_client_tool_may_not_take_a_server_tool_name():
    import pytest

    session, _, _ = make([])
    with pytest.raises(p.ProtocolError, match="server-side"):
        session.set_tools((ToolSpec.of("book_table"),), None)


async def test_cancelling_while_a_tool_runs_ends_the_reply_at_once():
    global GATE
    GATE = asyncio.Event()  # never set: the tool would run until its timeout
    session, engine, events = make(
        [call("slow_lookup", day="monday"), "Never said."], filler="", filler_after_ms=0
    )
    session.add_user_text("when are you open on monday")
    session.respond()
    await until(lambda: of(events, ev.ToolCallDone))
    session.cancel_response()
    assert await session.wait_turn(timeout=5)
    (done,) = of(events, ev.ReplyDone)
    assert done.finish_reason is ev.ReplyEnd.CANCELLED
    assert len(engine.requests) == 1 and not of(events, ev.ToolResult)


async def test_what_was_heard_of_a_reply_over_tool_rounds_is_cut_in_its_last_message():
    session, _, events = make(
        [f"Let me check. {call('book_table', people=2, time='18:00')}", "Booked for two at six."]
    )
    await reply_to(session, "book for two at six")
    (done,) = of(events, ev.ReplyDone)
    assert done.text == "Let me check. Booked for two at six."
    assert done.text[done.item_offset :] == "Booked for two at six."
    # the listener heard up to "Booked for" of the whole reply's text
    cut = session.keep_heard(done.item_id, len("Let me check. Booked for"), done.item_offset)
    assert cut.text == "Booked for"
    assert session.keep_heard(done.item_id, 5, done.item_offset).text == ""  # not even reached
    assert session.keep_heard("item_nope", 5) is None


async def test_complete_calls_are_made_when_the_budget_cuts_the_next_one():
    whole = call("book_table", people=4, time="19:30")
    cut = call("slow_lookup", day="monday")
    budget = len(f"{whole} ".split(" ")) + 2  # the second call is cut after its name
    session, engine, events = make([f"{whole} {cut}", "Booked for four."], parallel=True)
    session.add_user_text("a table for four at half seven; are you open on monday?")
    session.respond(max_new_tokens=budget)
    await session.wait_turn()
    (result,) = of(events, ev.ToolResult)  # the whole call ran
    assert json.loads(result.output)["people"] == 4
    (error,) = of(events, ev.SessionError)
    assert "1 tool call(s) cut off (length)" in error.message and not error.fatal
    assert len(engine.requests) == 2  # and the reply went on with its output
    final = of(events, ev.ReplyDone)[-1]
    assert final.text == "Booked for four." and final.finish_reason is ev.ReplyEnd.STOP
    assert not session.history.pending_calls()  # no call left without its output


async def test_a_client_call_before_the_budget_ran_out_waits_for_its_output():
    weather = ToolSpec.of(
        "weather", "Weather", {"type": "object", "properties": {"city": {"type": "string"}}}
    )
    whole = call("weather", city="Paris")
    session, _, events = make(
        [f"{whole} {call('weather', city='Rome')}"], p.SessionStart(tools=(weather,)), parallel=True
    )
    session.add_user_text("weather in paris and rome?")
    session.respond(max_new_tokens=len(whole.split(" ")) + 1)
    await session.wait_turn()
    (done,) = of(events, ev.ToolCallDone)
    (reply,) = of(events, ev.ReplyDone)
    assert reply.calls == (done.call_id,) and reply.finish_reason is ev.ReplyEnd.LENGTH
    assert [c.call_id for c in session.waiting_calls()] == [done.call_id]
