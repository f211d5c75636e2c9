"""The server's model of a client's playout (audio/playout.py)."""

from voicert.audio.playout import Playout

MS = 1_000_000


def test_audio_sent_ahead_plays_back_to_back_from_the_first_chunk():
    p = Playout()
    assert p.add(1000 * MS, sent_ns=10_000 * MS) == 10_000 * MS
    assert p.add(1000 * MS, sent_ns=10_050 * MS) == 11_000 * MS  # waits for the one before
    assert p.playing(11_999 * MS) and not p.playing(12_000 * MS)
    assert p.played_ns(10_500 * MS) == 500 * MS and p.played_ns(11_250 * MS) == 1250 * MS
    assert p.played_ns(13_000 * MS) == 2000 * MS  # all of it, and no more


def test_audio_sent_after_a_gap_plays_when_it_arrives_and_the_gap_is_not_played():
    p = Playout()
    p.add(300 * MS, sent_ns=0)
    assert p.add(200 * MS, sent_ns=500 * MS) == 500 * MS  # the first chunk had played out
    assert p.played_ns(400 * MS) == 300 * MS
    assert p.played_ns(600 * MS) == 400 * MS  # 300 before the gap, 100 since


def test_stopping_ends_the_playout():
    p = Playout()
    p.add(5000 * MS, sent_ns=0)
    p.stop()
    assert not p.playing(1 * MS) and p.played_ns(1 * MS) == 0
    assert p.add(100 * MS, sent_ns=2000 * MS) == 2000 * MS
