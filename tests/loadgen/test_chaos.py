"""The chaos harness: every hostile message it sends gets an answer from the real server (a typed
error or a close with a code) and the server goes on serving; its report counts lost turns."""

from loadgen.caller import CallerStats, TurnSample
from loadgen.chaos import HOSTILE, ChaosLog, hostile, report
from tests.server.test_stream import assert_server_still_serves


async def test_every_hostile_message_is_answered_and_the_server_goes_on(url):
    log = ChaosLog()
    for door, frames in HOSTILE:
        await hostile(url, door, frames, log)
    assert log.hostile_sent == len(HOSTILE) and log.hostile_unanswered == []
    await assert_server_still_serves(url)


def test_the_report_meets_the_target_only_without_lost_turns():
    stats = CallerStats(
        turns=[TurnSample(1, finish_reason="stop"), TurnSample(1, finish_reason="error")]
    )
    text, ok = report(stats, ChaosLog(kills=1, hostile_sent=3))
    assert ok and "| turns lost (no answer: timeouts + dropped sessions) | 0 |" in text
    stats.timeouts = 1
    assert not report(stats, ChaosLog())[1]
    text, ok = report(
        CallerStats(turns=[TurnSample(1, finish_reason="stop")]),
        ChaosLog(hostile_unanswered=["/twilio: no answer"]),
    )
    assert not ok and "unanswered: /twilio" in text
