"""The replica benchmark's level runner over fake engines: sessions make turns, the table says
what it measured (its own timing is not asserted)."""

import argparse

from tests.agent.fakes import FakeEngine
from voicert.bench.replicas import render, run_level
from voicert.engine.clients.replicas import ReplicaEngine


class Replica(FakeEngine):
    def live_requests(self):
        return set()


async def test_a_level_runs_conversations_over_the_replicas_and_reports_them():
    one, two = Replica(), Replica()
    engine = ReplicaEngine([one, two])
    args = argparse.Namespace(think=0.001, new=4, duration=1.0, warmup=0.0)
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
