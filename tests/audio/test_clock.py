"""The session's audio clock on a fake clock: frames on time have no lag, a backlog shows as lag
until it drains, a caller's pause anchors the timeline again, and a caller ahead of real time
moves the origin back."""

from voicert.audio.clock import AudioClock

MS = 1_000_000
FRAME = 20 * MS


def test_frames_handled_as_they_are_made_have_no_lag():
    clock = AudioClock()
    for i in range(50):
        clock.idle()  # a reader that keeps up waits for every frame
        assert clock.frame(FRAME, 1_000 * MS + (i + 1) * FRAME) == 0


def test_a_backlog_shows_as_lag_until_it_drains():
    clock = AudioClock()
    clock.idle()
    assert clock.frame(FRAME, 100 * MS) == 0
    # the reader is kept from the socket for 300 ms: 15 frames wait, then come in a burst
    lags = [clock.frame(FRAME, 420 * MS + i * MS) for i in range(16)]
    assert lags[0] == 300 * MS  # the frame made at 120 ms handled at 420
    assert lags[-1] == 435 * MS - 420 * MS  # the burst's last frame was made at 420 ms
    clock.idle()  # drained: the reader waits for the caller again
    assert clock.frame(FRAME, 460 * MS) == 0
    assert clock.made_ns(460 * MS) == 460 * MS


def test_a_pause_in_the_callers_audio_is_not_lag():
    clock = AudioClock()
    clock.idle()
    clock.frame(FRAME, 20 * MS)
    clock.idle()  # two seconds without audio (between turns), the reader waiting
    assert clock.frame(FRAME, 2_040 * MS) == 0
    assert clock.frame(FRAME, 2_060 * MS) == 0


def test_a_caller_ahead_of_real_time_moves_the_origin_back():
    clock = AudioClock()
    clock.idle()
    clock.frame(FRAME, 20 * MS)
    # a second of audio in 100 ms (a file streamed fast): never negative, never lag
    assert all(clock.frame(FRAME, 20 * MS + i * 2 * MS) == 0 for i in range(1, 51))
    assert clock.origin_ns == 20 * MS + 100 * MS - 51 * FRAME


def test_made_ns_takes_a_frames_own_lag():
    clock = AudioClock()
    clock.idle()
    clock.frame(FRAME, 20 * MS)
    lag = clock.frame(FRAME, 140 * MS)  # 100 ms late
    assert clock.made_ns(140 * MS) == 40 * MS and clock.made_ns(500 * MS, lag) == 400 * MS
