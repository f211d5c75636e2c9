"""Engine replicas (engine/clients/replicas.py): placement that keeps a conversation on its replica while
that replica is not much busier, spreads new ones, avoids replicas that are down; the engine over
them routes cancels, counts open requests back to zero, and gives up only when every replica has."""

from __future__ import annotations

import dataclasses

from tests.agent.fakes import FakeEngine
from voicert.core.chat import ChatMessage
from voicert.core.llm import EngineState, GenerationRequest
from voicert.engine.clients.replicas import Placement, ReplicaEngine, conversation_key


def test_a_conversation_stays_on_its_replica_and_new_ones_spread():
    p = Placement(2)
    loads = [0, 0]
    a = p.pick("a", loads, [True, True])
    loads[a] += 1
    b = p.pick("b", loads, [True, True])
    assert a != b  # the least busy
    loads[b] += 1
    assert p.pick("a", loads, [True, True]) == a
    assert p.kept == 1 and p.moved == 0


def test_ties_go_round_robin():
    p = Placement(3)
    assert [p.pick(k, [0, 0, 0], [True] * 3) for k in "abcdef"] == [0, 1, 2, 0, 1, 2]


def test_a_conversation_moves_when_its_replica_is_much_busier_or_down():
    p = Placement(2, slack=4)
    assert p.pick("a", [0, 0], [True, True]) == 0
    assert p.pick("a", [4, 0], [True, True]) == 0  # within the slack: its cache is worth it
    assert p.pick("a", [5, 0], [True, True]) == 1  # too busy: moved to the least busy
    assert p.pick("a", [0, 0], [True, True]) == 1  # and stays there
    assert p.pick("a", [0, 0], [True, False]) == 0  # its replica is down
    assert p.moved == 2
    assert p.pick("a", [40, 0], [True, False]) == 0  # the only one serving
    assert p.pick("b", [0, 0], [False, False]) == -1


def test_the_slack_grows_with_the_load():
    p = Placement(2, slack=4)
    assert p.pick("a", [100, 100], [True, True]) == 0
    assert p.pick("a", [125, 100], [True, True]) == 0  # a quarter of 100
    assert p.pick("a", [126, 100], [True, True]) == 1


def test_only_the_most_recent_conversations_are_remembered():
    p = Placement(2, max_conversations=2)
    for key in "abc":
        p.pick(key, [0, 0], [True, True])
    assert p.pick("a", [0, 0], [True, True]) in (0, 1) and p.kept == 0  # forgotten


def request(rid: str, session: str = "s1", first_user: str = "Hi") -> GenerationRequest:
    return GenerationRequest(
        rid,
        [ChatMessage("system", "Be brief."), ChatMessage("user", first_user)],
        8,
        session_id=session,
    )


def test_the_conversation_key_is_the_session_else_the_conversations_opening():
    assert conversation_key(request("r", "sess-7")) == "sess-7"
    first = request("r1", "http")
    grown = dataclasses.replace(
        first,
        request_id="r2",
        messages=[*first.messages, ChatMessage("assistant", "Hello"), ChatMessage("user", "More")],
    )
    assert conversation_key(first) == conversation_key(grown)
    assert conversation_key(first) != conversation_key(request("r3", "", "Other"))


@dataclasses.dataclass
class Replica(FakeEngine):
    state: EngineState = EngineState.SERVING
    last_failure: str | None = None
    on_give_up: object = None

    def live_requests(self):
        return set()


async def drain(stream):
    return [e async for e in stream]


async def test_requests_follow_their_conversation_and_counts_return_to_zero():
    one, two = Replica(), Replica()
    engine = ReplicaEngine([one, two])
    await drain(engine.submit(request("a1", "a")))
    await drain(engine.submit(request("b1", "b")))
    await drain(engine.submit(request("a2", "a")))
    assert [r.request_id for r in one.requests] == ["a1", "a2"]
    assert [r.request_id for r in two.requests] == ["b1"]
    assert engine.open_requests() == [0, 0]
    stats = engine.stats()
    assert stats.extra["placement_kept"] == 1 and stats.extra["engine_up"] == 1.0


async def test_cancel_reaches_the_replica_that_holds_the_request():
    one, two = Replica(gated=True), Replica(gated=True)
    engine = ReplicaEngine([one, two])
    s1 = engine.submit(request("a1", "a"))
    s2 = engine.submit(request("b1", "b"))
    assert engine.open_requests() == [1, 1]
    engine.cancel("b1")
    assert two.cancelled == {"b1"} and not one.cancelled
    assert (await drain(s2))[-1].finish_reason == "cancelled"
    one.release("a1")
    del s1  # dropped without reading to its end (the caller cancelled and went)
    import gc

    gc.collect()
    assert engine.open_requests() == [0, 0]


async def test_a_replica_that_is_down_gets_no_new_request_and_only_all_down_gives_up():
    one, two = Replica(), Replica()
    engine = ReplicaEngine([one, two])
    gave_up = []
    engine.on_give_up = gave_up.append
    await drain(engine.submit(request("a1", "a")))
    home = one if one.requests else two
    home.state = EngineState.RESTARTING
    await drain(engine.submit(request("a2", "a")))
    assert home.requests[-1].request_id == "a1"  # a2 went to the other one
    assert engine.healthy
    home.state, home.last_failure = EngineState.FAILED, "CUDA error"
    home.on_give_up("CUDA error")
    assert not gave_up and engine.healthy
    other = two if home is one else one
    other.state = EngineState.FAILED
    other.on_give_up("CUDA error")
    assert engine.state is EngineState.FAILED and len(gave_up) == 1
    final = (await drain(engine.submit(request("a3", "a"))))[-1]
    assert final.finish_reason == "error" and "no replica serves" in final.error
