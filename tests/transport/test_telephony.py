"""Telephony playback, sans-I/O: whole 20 ms frames, a mark per spoken piece and at the end,
clear on barge-in only while audio is queued or playing, and nothing of a cleared reply after it."""

from __future__ import annotations

import json

from voicert.protocol import twilio as tw
from voicert.transport.telephony import Playback


def kinds(frames):
    return [json.loads(f)["event"] for f in frames]


def marks(frames):
    return [json.loads(f)["mark"]["name"] for f in frames if json.loads(f)["event"] == "mark"]


def playback():
    return Playback(tw.Serializer("MZ1"))


def test_audio_goes_out_in_whole_frames_and_the_end_is_padded_and_marked():
    play = playback()
    out = play.audio(1, 0, "Hello there.", b"\x01" * 400)  # 2 frames and 80 bytes over
    assert kinds(out) == ["media", "media"]
    out = play.reply_done(1)
    assert kinds(out) == ["media", "mark"] and marks(out) == ["turn1-end"]
    last = tw.decode_outbound(out[0])["media"]["payload"]
    assert last == b"\x01" * 80 + b"\xff" * 80  # padded with mu-law silence


def test_each_new_piece_is_marked_so_playback_is_known():
    play = playback()
    play.audio(1, 0, "First piece.", b"\x01" * 160)
    out = play.audio(1, 1, "Second piece.", b"\x01" * 160)
    assert marks(out) == ["turn1-piece1"]
    play.reply_done(1)
    assert play.playing
    play.mark_played("turn1-piece1")
    assert play.marks == ["turn1-end"]
    play.mark_played("turn1-end")
    assert not play.playing


def test_barge_in_clears_what_is_queued_and_drops_the_rest_of_that_reply():
    play = playback()
    play.audio(1, 0, "A long reply.", b"\x01" * 320)  # the first piece: no mark before it
    assert kinds(play.speech_started(2)) == ["clear"]
    assert play.audio(1, 3, "", b"\x01" * 320) == []  # still on its way: dropped
    assert play.reply_done(1) == []  # no end mark: it did not play to the end
    assert kinds(play.audio(2, 0, "The next reply.", b"\x01" * 160)) == ["media"]


def test_no_clear_when_nothing_is_playing():
    play = playback()
    play.audio(1, 0, "Short.", b"\x01" * 160)
    play.reply_done(1)
    play.mark_played("turn1-end")
    assert play.speech_started(2) == []


def test_a_reply_cut_off_keeps_only_the_pieces_the_caller_heard():
    from voicert.transport.spoken import covered_chars

    play = playback()
    play.audio(3, 0, "One two three.", b"\x01" * 320)
    play.audio(3, 1, " Four five.", b"\x01" * 320)
    play.audio(3, 2, " Six seven.", b"\x01" * 320)
    play.mark_played("turn3-piece1")  # the first piece played
    assert play.heard(3) is None  # not cut off (yet)
    assert kinds(play.speech_started(4)) == ["clear"]
    play.mark_played("turn3-piece2")  # an echo after the clear changes nothing
    assert play.heard(3) == ["One two three."] and play.heard(2) is None
    text = "One two three. Four five. Six seven."
    assert text[: covered_chars(text, play.heard(3))] == "One two three."


def test_a_reply_played_to_its_end_is_not_cut():
    play = playback()
    play.audio(5, 0, "All of it.", b"\x01" * 320)
    play.reply_done(5)
    play.mark_played("turn5-end")
    assert play.speech_started(6) == [] and play.heard(5) is None
