"""The token bucket on a given clock: a burst at once, then the average rate, whole amounts."""

from voicert.core.bucket import TokenBucket


def test_a_burst_then_twice_real_time_and_whole_frames_refused():
    b = TokenBucket(rate=2.0, burst=10.0)
    assert all(b.take(1.0, 0.0) for _ in range(10))  # a 10 s recording at once
    assert not b.take(0.5, 0.0) and b.tokens == 0.0  # refused whole: nothing taken
    assert b.take(2.0, 1.0) and not b.take(0.02, 1.0)  # one second later: two seconds more
    assert b.take(10.0, 100.0) and not b.take(0.02, 100.0)  # refilled, never above the burst


def test_rate_zero_takes_everything():
    b = TokenBucket(rate=0.0, burst=1.0)
    assert b.take(3600.0, 0.0) and b.allow(0.0)
