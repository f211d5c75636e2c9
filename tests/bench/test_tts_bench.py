"""bench.tts's arithmetic: the stall a listener would hear while a reply's audio is made."""

import pytest

from voicert.bench.tts import stall_ms


def test_audio_that_keeps_ahead_of_playback_never_stalls():
    # 1 s chunks at 10 Hz-samples, each made 0.5 s after the one before
    assert stall_ms([0.0, 0.5, 1.0, 1.5], [10, 10, 10, 10], 10) == 0.0


def test_a_chunk_late_for_its_turn_stalls_by_how_late_and_playback_resumes_from_it():
    # the second chunk is due at 1.0 s (the first played out), comes at 1.3; the third is then
    # due at 1.3 + 1.0 = 2.3 and comes at 2.4
    assert stall_ms([0.0, 1.3, 2.4], [10, 10, 10], 10) == pytest.approx(300.0)
    assert stall_ms([0.0, 1.3, 2.5], [10, 10, 10], 10) == pytest.approx(300.0)
    assert stall_ms([0.0, 1.3, 2.9], [10, 10, 10], 10) == pytest.approx(600.0)
