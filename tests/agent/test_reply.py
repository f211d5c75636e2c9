"""A reply on its own: a fake engine, a list for emit, no models, no sleeping."""

import asyncio

from tests.agent.fakes import FakeEngine
from voicert.agent.reply import Reply
from voicert.core import events as ev
from voicert.core.llm import GenerationRequest, final_event
from voicert.telemetry.latency import Point, TurnTrace


def make(engine, turn_id: int = 3):
    sent = []

    async def emit(event):
        sent.append(event)

    request = GenerationRequest("r1", [], 16)
    return Reply(engine, request, turn_id, TurnTrace(turn_id), emit), sent


async def test_tokens_are_emitted_in_order_and_the_outcome_holds_the_text():
    reply, sent = make(FakeEngine(reply="Paris is the capital."))
    out = await reply.run()
    assert isinstance(sent[0], ev.ReplyStarted) and sent[0].spoken is False
    tokens = [e for e in sent if isinstance(e, ev.ReplyToken)]
    assert [t.index for t in tokens] == [0, 1, 2, 3]
    assert "".join(t.text for t in tokens) == "Paris is the capital."
    assert (out.text, out.tokens, out.prompt_tokens, out.reason) == (
        "Paris is the capital.",
        4,
        10,
        "stop",
    )
    assert Point.FIRST_TOKEN_SENT in reply.trace.points and Point.DONE in reply.trace.points


async def test_a_cancelled_reply_emits_nothing_more_and_ends_with_the_reason_given():
    engine = FakeEngine(reply="one two three four five", gated=True)
    reply, sent = make(engine)
    task = asyncio.ensure_future(reply.run())
    for _ in range(2):
        while not engine.requests:
            await asyncio.sleep(0)
        engine.release("r1")
        while len([e for e in sent if isinstance(e, ev.ReplyToken)]) < _ + 1:
            await asyncio.sleep(0)
    reply.cancel("interrupted")
    reply.cancel("cancelled")  # a second cancel changes nothing
    out = await task
    assert engine.cancelled == {"r1"}
    assert [e.text for e in sent if isinstance(e, ev.ReplyToken)] == ["one", " two"]
    assert (out.text, out.tokens, out.reason) == ("one two", 2, "interrupted")


async def test_an_engine_error_is_announced_and_ends_the_reply_with_error():
    class Failing(FakeEngine):
        async def _stream(self, request):
            yield final_event("error", "engine failed: boom")

    reply, sent = make(Failing())
    out = await reply.run()
    errors = [e for e in sent if isinstance(e, ev.SessionError)]
    assert [e.message for e in errors] == ["engine failed: boom"]
    assert out.reason == "error" and out.tokens == 0


async def test_a_reply_cancelled_from_outside_still_frees_its_engine_request():
    engine = FakeEngine(gated=True)
    reply, _ = make(engine)
    task = asyncio.ensure_future(reply.run())
    while not engine.requests:
        await asyncio.sleep(0)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    assert engine.cancelled == {"r1"} and reply.outcome.reason == "cancelled"
