"""What a listener heard of a spoken reply: the piece timeline and the native door's pacing clock."""

from voicert.transport.spoken import PacingClock, SpokenReply, bytes_per_ms

MS = 1_000_000  # ns


def test_heard_text_is_every_piece_played_and_the_share_of_the_one_playing():
    spoken = SpokenReply(bytes_per_ms=48)
    spoken.add(b"\0" * 48 * 1000, "One two three four.")  # 0-1000 ms
    spoken.add(b"\0" * 48 * 500, "")
    spoken.add(b"\0" * 48 * 1000, " Five six.")  # 1500-2500 ms
    spoken.text = "One two three four. Five six. Seven."
    assert spoken.heard_chars(0) == 0
    assert spoken.text[: spoken.heard_chars(750)] == "One two"  # half of 0-1500 ms: 2 of 4 words
    assert spoken.text[: spoken.heard_chars(1500)] == "One two three four."
    assert spoken.text[: spoken.heard_chars(2000)] == "One two three four. Five"
    assert spoken.text[: spoken.heard_chars(2500)] == "One two three four. Five six."


def test_the_pacing_clock_cuts_a_reply_where_the_caller_talked_over_it():
    clock = PacingClock()
    clock.started(2, bytes_per_ms("pcm16", 24000))  # 48 bytes per ms
    clock.audio(2, b"\0" * 48 * 1000, "One two three four.", now_ns=10_000 * MS)
    clock.audio(2, b"\0" * 48 * 1000, " Five six.", now_ns=10_050 * MS)  # sent ahead of playback
    clock.speech_started(now_ns=10_500 * MS)  # the caller talks 0.5 s into it
    reply = clock.done(2, "One two three four. Five six.", "item_9", interrupted=True)
    assert reply is not None and reply.cut_ms == 500
    assert reply.text[: reply.heard_chars(reply.cut_ms)] == "One two"


def test_no_cut_unless_the_server_interrupted_the_reply():
    clock = PacingClock()
    clock.started(1, 48)
    clock.audio(1, b"\0" * 48 * 2000, "Hello there.", now_ns=0)
    clock.speech_started(now_ns=100 * MS)  # speech, but the reply was not interrupted (no barge-in)
    assert clock.done(1, "Hello there.", "item_1", interrupted=False) is None
    clock.started(3, 48)
    clock.audio(3, b"\0" * 48 * 500, "Bye.", now_ns=5000 * MS)
    assert clock.done(3, "Bye.", "item_3", interrupted=False) is None
    assert clock.speech_started(now_ns=5600 * MS) is None  # done, and played to its end
    assert clock.reply.cut_ms is None


def test_a_barge_in_on_a_reply_all_sent_but_still_playing_cuts_it_at_once():
    # a fast engine and voice: the whole reply was sent (and done) long before it had played
    clock = PacingClock()
    clock.started(4, 48)
    clock.audio(4, b"\0" * 48 * 1000, "One two three four.", now_ns=1000 * MS)
    clock.audio(4, b"\0" * 48 * 1000, " Five six.", now_ns=1010 * MS)
    text = "Sure. One two three four. Five six."  # a tool round's text came first
    assert clock.done(4, text, "item_4", interrupted=False, item_offset=6) is None
    reply = clock.speech_started(now_ns=2500 * MS)  # 1.5 s in: the caller says "wait"
    assert reply is not None and reply.cut_ms == 1500 and reply.item_offset == 6
    assert reply.text[: reply.heard_chars(reply.cut_ms)] == "Sure. One two three four. Five"
    assert clock.speech_started(now_ns=2600 * MS) is None  # cut once


def test_the_pacing_clock_does_not_count_a_gap_in_slow_audio_as_played():
    # a voice slower than real time: the second piece arrives 2 s after the first has played out;
    # the client plays it from then, so 0.5 s into it the caller has heard the first piece and
    # half of the second, not the 3.5 s since the first chunk
    clock = PacingClock()
    clock.started(4, bytes_per_ms("pcm16", 24000))
    clock.audio(4, b"\0" * 48 * 1000, "One two three four.", now_ns=0)
    clock.audio(4, b"\0" * 48 * 1000, " Five six seven eight.", now_ns=3000 * MS)
    clock.speech_started(now_ns=3500 * MS)
    text = "One two three four. Five six seven eight."
    reply = clock.done(4, text, "item_4", interrupted=True)
    assert reply.cut_ms == 1500.0
    assert text[: reply.heard_chars(reply.cut_ms)] == "One two three four. Five six"
