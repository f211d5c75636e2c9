"""Admission at the door on a fake clock (server/admission.py): the door closes when the server
falls behind the audio or its turns pass the budget, new sessions are refused while the ones in keep their place, it opens again after
a calm interval with a ceiling that rises one session at a time; and over a real server, a
closed door answers the handshake with 503 and Retry-After, and /readyz with 503."""

import asyncio
import urllib.error
import urllib.request

import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import InvalidStatus

from tests.conftest import server_with
from voicert.server.admission import Admission


def test_the_door_stays_open_while_the_server_keeps_up():
    a = Admission(lag_ms=250, calm_s=5)
    for t in range(20):
        a.observe(t, 40.0, sessions=30)
    assert not a.closed and a.refusal(30) is None and a.ceiling is None


def test_falling_behind_closes_the_door_but_never_to_an_empty_server():
    a = Admission(lag_ms=250, calm_s=5)
    a.observe(0, 900.0, sessions=12)
    assert a.closed and a.ceiling == 11
    assert a.refusal(12) == "overloaded: audio handled 900 ms late (server.admission_lag_ms 250)"
    assert a.refusal(0) is None  # nobody in to degrade


def test_turns_past_the_budget_close_the_door_once_enough_of_them_say_so():
    a = Admission(lag_ms=250, calm_s=5, budget_ms=500)
    a.observe(0, 10.0, sessions=8, ttfts_ms=(2000.0, 3000.0))  # two turns: too few to tell
    assert not a.closed
    a.observe(1, 10.0, sessions=8, ttfts_ms=(900.0, 40.0))  # median of 4: 2000
    assert a.closed and a.ceiling == 7
    assert a.refusal(8) == (
        "overloaded: first tokens 2000 ms after the turn ended, median of the last 4 turns "
        "(telemetry.budget_ms 500)"
    )
    a.observe(5, 10.0, sessions=7, ttfts_ms=(100.0,) * 10)  # a median under half: calm begins
    a.observe(10, 10.0, sessions=7)
    assert not a.closed


def test_slow_turns_age_out_of_the_window():
    a = Admission(lag_ms=250, calm_s=2, budget_ms=500)
    a.observe(0, 10.0, sessions=8, ttfts_ms=(2000.0,) * 5)
    assert a.closed
    for t in range(11, 14):  # ten seconds on, they no longer count
        a.observe(t, 10.0, sessions=6)
    assert not a.closed


def test_it_opens_after_a_calm_interval_and_takes_callers_back_one_at_a_time():
    a = Admission(lag_ms=250, calm_s=5)
    a.observe(0, 900.0, sessions=12)
    a.observe(1, 200.0, sessions=12)  # under the limit, not under half: not calm
    a.observe(3, 100.0, sessions=12)  # calm from here
    a.observe(7, 100.0, sessions=12)
    assert a.closed  # 4 s of calm
    a.observe(8, 100.0, sessions=10)
    assert not a.closed and a.ceiling == 11
    assert a.refusal(10) is None and a.refusal(11).startswith("recovering from overload")
    a.observe(13, 100.0, sessions=11)  # another calm interval: one more
    assert a.ceiling == 12 and a.refusal(11) is None


def test_falling_behind_again_below_the_ceiling_lowers_it():
    a = Admission(lag_ms=250, calm_s=1)
    a.observe(0, 900.0, sessions=12)
    a.observe(1, 10.0, sessions=11)
    a.observe(2, 10.0, sessions=11)
    assert not a.closed and a.ceiling == 11
    a.observe(3, 400.0, sessions=9)  # still behind with fewer
    assert a.closed and a.ceiling == 8


def test_a_ceiling_far_above_the_sessions_in_is_dropped():
    a = Admission(lag_ms=250, calm_s=1)
    a.observe(0, 900.0, sessions=4)
    for t in range(1, 10):
        a.observe(t, 10.0, sessions=1)
    assert not a.closed and a.ceiling is None


@pytest.mark.parametrize("admission", [True, False])
async def test_a_server_behind_refuses_new_sessions_and_says_so_on_readyz(services, admission):
    from voicert.server.app import STREAM_PATH
    from voicert.telemetry.sampler import SystemSample

    srv = await server_with(services, admission=admission, admission_calm_s=30)
    base = f"127.0.0.1:{srv.port}"
    try:
        async with connect(f"ws://{base}{STREAM_PATH}"):  # a session in (a socket counts)
            srv.services.metrics.session_started()
            try:
                behind = SystemSample(0.0, 1, 0, 0, 0, 0.0, loop_lag_ms=3.0, ingest_lag_ms=1800.0)
                srv._admit(behind)  # what the sampler hands its listeners each interval
                if not admission:
                    assert srv.admission is None
                    async with connect(f"ws://{base}{STREAM_PATH}"):
                        pass  # taken: off is off
                    return
                with pytest.raises(InvalidStatus) as refused:
                    async with connect(f"ws://{base}{STREAM_PATH}"):
                        pass
                response = refused.value.response
                assert response.status_code == 503 and response.headers["Retry-After"] == "30"
                assert b"overloaded: audio handled 1800 ms late" in response.body
                with pytest.raises(urllib.error.HTTPError) as ready:  # (off the server's loop)
                    await asyncio.to_thread(urllib.request.urlopen, f"http://{base}/readyz")
                assert ready.value.code == 503
                assert srv.services.metrics.admission_closed._value.get() == 1.0
            finally:
                srv.services.metrics.session_ended()
    finally:
        await srv.shutdown()
