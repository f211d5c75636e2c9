"""The text cue of semantic turn detection: transcripts that stop mid-phrase."""

import pytest

from voicert.speech.turn_text import continues


@pytest.mark.parametrize("text", [
    "I would like to book a table for", "I would like to book a table for.",
    "My name is John and I want to...", "Could you remind me to call my…",
    "How far is it from London to?", "So I was thinking, ", "Well - ", "um", "The price is the",
    "I’m going to see my", "It depends on whether we",
])
def test_a_transcript_that_stops_mid_phrase_continues(text):
    assert continues(text)


@pytest.mark.parametrize("text", [
    "", "   ", "What is the capital of France?", "Thank you, that is all.", "Yes it is.",
    "Book a table for four people tonight.", "I think so", "Play some relaxing music",
])
def test_a_transcript_that_could_end_there_does_not(text):
    assert not continues(text)
