"""The dashboards' system figures with several workers: sessions and engine steps add up over the
workers, the engine's queue is the shared engine's, the loop lag is the worst worker's, and a
worker that stopped reporting drops out. The sampler's ticks keep their phase, and neither burst
after a held-up loop nor run ahead of the clock."""

from voicert.telemetry.sampler import Sampler, SystemSample, next_tick


class _Svc:  # what a Sampler reads; only the merge is under test here
    metrics = None


def test_workers_samples_merge_into_one_view():
    ours = SystemSample(
        t=1.0, sessions=3, queue_depth=2, running=5, steps=10, mean_batch=2.0, loop_lag_ms=0.4
    )
    theirs = SystemSample(
        t=1.0, sessions=4, queue_depth=2, running=5, steps=0, mean_batch=0.0, loop_lag_ms=3.5
    )
    merged = ours.merged([theirs])
    assert (merged.sessions, merged.steps, merged.mean_batch) == (7, 10, 2.0)
    assert (merged.queue_depth, merged.running, merged.loop_lag_ms) == (2, 5, 3.5)
    assert ours.merged([]) is ours


def test_a_peer_that_stopped_reporting_is_left_out():
    clock = [100.0]
    sampler = Sampler(_Svc(), interval_s=1.0, clock=lambda: clock[0])
    sampler.add_peer_sample(1, SystemSample(0.0, 4, 0, 0, 0, 0.0, 0.1))
    sampler.add_peer_sample(2, SystemSample(0.0, 6, 0, 0, 0, 0.0, 0.1))
    clock[0] += 2.0
    sampler.add_peer_sample(2, SystemSample(0.0, 6, 0, 0, 0, 0.0, 0.1))
    clock[0] += 2.0  # worker 1 last spoke 4 s ago (3 intervals is the limit), worker 2 2 s ago
    assert [s.sessions for s in sampler.fresh_peers()] == [6]


async def test_the_engine_gauges_are_right_from_the_start_not_after_the_first_tick():
    """With several workers the engine-up gauge is the smallest over them: a worker that had not
    ticked yet read as "down" (its gauge's initial 0) and made the whole server look down."""
    from types import SimpleNamespace

    from tests.agent.fakes import FakeAsr, FakeEngine
    from voicert.telemetry.metrics import Metrics

    svc = SimpleNamespace(metrics=Metrics(), engine=FakeEngine(), asr=FakeAsr(), gc_watch=None)
    sampler = Sampler(svc, interval_s=3600)  # no tick during the test
    sampler.start()
    try:
        assert svc.metrics.engine_up._value.get() == 1.0
    finally:
        await sampler.stop()


def test_ticks_keep_their_phase_and_never_burst_or_run_ahead_of_the_clock():
    assert next_tick(10.0, 10.002, 1.0) == 11.0  # on time: an interval on, the phase kept
    assert next_tick(10.0, 10.9, 1.0) == 11.0
    assert next_tick(10.0, 14.5, 1.0) == 14.5  # held up 4.5 s: one tick now, not four
    # woken early (a sleep that returned at once, over and over): never past now + 1 interval
    last = 10.0
    for _ in range(1000):
        last = next_tick(last, 10.0, 1.0)
    assert last == 11.0
