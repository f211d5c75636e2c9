"""The text cue of semantic turn detection: transcripts that stop mid-phrase."""

import pytest

from voicert.speech.turn_text import continues, is_backchannel


@pytest.mark.parametrize(
    "text",
    [
        "I would like to book a table for",
        "I would like to book a table for.",
        "My name is John and I want to...",
        "Could you remind me to call my…",
        "How far is it from London to?",
        "So I was thinking, ",
        "Well - ",
        "um",
        "The price is the",
        "I’m going to see my",
        "It depends on whether we",
    ],
)
def test_a_transcript_that_stops_mid_phrase_continues(text):
    assert continues(text)


@pytest.mark.parametrize(
    "text",
    [
        "",
        "   ",
        "What is the capital of France?",
        "Thank you, that is all.",
        "Yes it is.",
        "Book a table for four people tonight.",
        "I think so",
        "Play some relaxing music",
        "Please count from 1 to 5.",  # Whisper writes numbers as digits: they end phrases too
        "Book a table for 4.",
        "My flight number is 247.",
    ],
)
def test_a_transcript_that_could_end_there_does_not(text):
    assert not continues(text)


@pytest.mark.parametrize(
    "text",
    [
        "Mm-hm.",
        "Mmm, Mmm.",
        "Hmm.",
        "Uh-huh.",
        "Yeah.",
        "Yeah, okay.",
        "Okay",
        "Right.",
        "I see.",
        "Sure.",
        "Got it.",
    ],
)
def test_a_backchannel_is_recognised(text):
    assert is_backchannel(text)


@pytest.mark.parametrize(
    "text",
    [
        "",
        "Wait.",
        "Stop, stop.",
        "No.",
        "Uh-uh.",
        "Hold on, what?",
        "Okay, so what about tomorrow?",
        "Yeah, but why?",
    ],
)
def test_an_interjection_is_not_a_backchannel(text):
    assert not is_backchannel(text)
