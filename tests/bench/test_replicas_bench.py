"""The replica benchmark's level runner over fake engines: sessions make turns, the table says
what it measured (its own timing is not asserted)."""

import argparse
import asyncio

from tests.agent.fakes import FakeEngine
from voicert.bench.replicas import capacity, render, run_level
from voicert.engine.clients.replicas import ReplicaEngine


class Replica(FakeEngine):
    def live_requests(self):
        return set()


async def test_a_level_runs_conversations_over_the_replicas_and_reports_them():
    one, two = Replica(), Replica()
    engine = ReplicaEngine([one, two])
    args = argparse.Namespace(think=0.001, new=4, duration=1.0, warmup=0.0, listen=0.0)
    row = (await run_level(engine, 2, 6, args)).row()
    assert row["turns"] >= 1 and row["sessions"] == 6
    sessions = {r.session_id for r in one.requests} | {r.session_id for r in two.requests}
    assert sessions <= {f"s{i}" for i in range(6)}
    # a conversation's turns all went to one replica
    assert not ({r.session_id for r in one.requests} & {r.session_id for r in two.requests})
    later = [r for r in one.requests + two.requests if r.request_id.endswith("-1")]
    assert all(len(r.messages) == 4 for r in later)  # system, turn 0 asked and answered, turn 1
    table = render([row], "fake")
    assert "| 2 | affinity | 6 |" in table


async def test_a_listening_caller_hears_the_reply_before_talking_again():
    """With ``listen`` the session waits the reply's tokens over the rate before its next turn
    (the fake replies with four words; the waits are recorded, not timed)."""
    waits: list[float] = []

    async def recorded(seconds: float) -> None:
        waits.append(seconds)
        await asyncio.sleep(0)

    args = argparse.Namespace(think=0.001, new=4, duration=0.2, warmup=0.0, listen=0.5)
    await run_level(ReplicaEngine([Replica(), Replica()]), 2, 1, args, pause=recorded)
    assert 4 / 0.5 in waits


def _row(sessions: int, p99: float, valid: bool = True) -> dict:
    return {"gpus": 1, "sessions": sessions, "ttft_p99": p99, "valid": valid}


def test_capacity_is_the_most_sessions_within_the_bar_and_names_the_first_level_past_it():
    rows = [_row(64, 30.0), _row(128, 80.0), _row(192, 140.0), _row(256, 400.0)]
    assert capacity(rows, 100) == (
        "- 1 GPU(s): 128 sessions within P99 TTFT <= 100 ms; 192 gave 140.0 ms"
    )
    # a client-bound level does not count, however low its P99
    assert capacity([_row(64, 30.0), _row(128, 50.0, valid=False)], 100).startswith(
        "- 1 GPU(s): 64 sessions"
    )
