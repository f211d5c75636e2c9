"""The hazard (agent/hazard.py): opinions at a pause into the silence that ends the turn, and a
caller's pause habit."""

import dataclasses

import pytest

from voicert.agent.hazard import RATE, Evidence, PauseHabit, bare, end_after_ms, log_odds
from voicert.core.speech import Ending


def test_evidence_that_the_turn_is_over_ends_it_at_the_judgement():
    assert end_after_ms(Evidence(0.95, 0.9, 0.2), 192, 1600) == 192


def test_doubt_is_waited_out_in_proportion_and_never_past_the_maximum():
    ev = Evidence(0.5, 0.01, 1e-6)
    short = -log_odds(ev)
    assert short > 0
    assert end_after_ms(ev, 192, 5000) == pytest.approx(192 + 1000 * short / RATE)
    doubt = Evidence(0.01, 1e-6, 1e-6, ending=Ending(stop=0.05, comma=0.9))  # heard a pause mark
    assert end_after_ms(doubt, 192, 600) == 600


def test_more_doubt_or_more_patience_waits_longer():
    sure, unsure = Evidence(0.6, 0.3, 0.01), Evidence(0.6, 0.001, 1e-5)
    assert end_after_ms(unsure, 192, 5000) > end_after_ms(sure, 192, 5000)
    assert end_after_ms(unsure, 192, 5000, bias=1.0) == pytest.approx(
        end_after_ms(unsure, 192, 5000) + 1000 / RATE
    )


def test_a_missing_opinion_counts_as_no_evidence_either_way():
    # no opinions at all: neither the most certain nor the most doubtful verdict
    nothing = end_after_ms(Evidence(), 192, 1600)
    assert end_after_ms(Evidence(0.99, 0.9, 0.5), 192, 1600) <= nothing
    assert nothing < end_after_ms(Evidence(0.01, 1e-6, 1e-6), 192, 1600)


def test_a_caller_who_pauses_long_inside_turns_gets_a_longer_wait():
    habit = PauseHabit()
    assert habit.scale == 1.0
    habit.observe(300)
    assert habit.scale == 1.0  # pausing briefly: the model's speed, never faster
    for _ in range(20):
        habit.observe(900)
    assert habit.scale == pytest.approx(1.8, abs=0.01)
    habit.observe(5000)
    assert habit.scale <= PauseHabit.MOST
    ev = Evidence(0.5, 0.01, 1e-6)
    assert end_after_ms(ev, 192, 5000, pause_scale=1.8) - 192 == pytest.approx(
        1.8 * (end_after_ms(ev, 192, 5000) - 192)
    )


def test_bare_drops_the_punctuation_whisper_ends_every_transcript_with():
    assert bare(" I want to visit Rome. ") == "I want to visit Rome"
    assert bare("the blue one...") == "the blue one"
    assert bare("Where are you from?") == "Where are you from"


def test_words_that_dangle_wait_longer_than_the_same_opinions_without_them():
    ev = Evidence(0.6, 0.05, 1e-4)
    plain = end_after_ms(ev, 192, 5000, bias=2.0)
    dangling = end_after_ms(Evidence(0.6, 0.05, 1e-4, dangling=True), 192, 5000, bias=2.0)
    assert dangling == pytest.approx(plain + 1000 * 2.0 / RATE)


def test_a_question_that_does_not_dangle_ends_sooner_and_the_cues_read_the_words():
    from voicert.agent.hazard import text_cues

    assert text_cues("What time do you open?") == (False, True)
    assert text_cues("How far is it from London to?") == (True, False)  # dangles: no rescue
    assert text_cues("I need eggs.") == (False, False)
    ev = Evidence(0.6, 0.05, 1e-4)
    asked = end_after_ms(Evidence(0.6, 0.05, 1e-4, question=True), 192, 5000, bias=2.0)
    assert asked == pytest.approx(end_after_ms(ev, 192, 5000, bias=2.0) - 1000 / RATE)


def test_the_pause_heads_opinion_counts_by_weights_fit_with_it_and_without_it_by_the_others():
    from voicert.agent import hazard as hz
    from voicert.agent.hazard import logit

    for without, with_pause, ev in (
        (hz.ZERO_SHOT, hz.ZERO_SHOT_PAUSE, Evidence(0.5, 0.01, 1e-6)),
        (hz.WITH_HEAD, hz.WITH_HEAD_PAUSE, Evidence(0.5, 0.01, head=0.4)),
    ):
        assert hz.weights(ev) is without  # no pause head: the weights fit without one
        assert with_pause.pause > 0  # a pause it hears as the end makes the end likelier
        done, doubt = (dataclasses.replace(ev, pause=p) for p in (0.9, 0.1))
        assert hz.weights(done) is with_pause
        assert log_odds(done) - log_odds(doubt) == pytest.approx(
            with_pause.pause * (logit(0.9) - logit(0.1))
        )
