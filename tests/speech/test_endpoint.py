from voicert.config import VadConfig
from voicert.speech.endpoint import Endpointer, EventKind


def run(probs, **kw):
    ep = Endpointer(VadConfig(**kw))
    return [(i, r.event) for i, p in enumerate(probs) if (r := ep.step(p)).event is not None]


def test_speech_start_after_min_speech_and_endpoint_after_min_silence():
    # 3 voiced windows (96 ms) start speech at its first window; 13 silent windows (416 ms) end it.
    probs = [0.0] * 5 + [0.9] * 10 + [0.1] * 20
    events = run(probs, min_speech_ms=96, min_silence_ms=400)
    (i0, start), (_i1, end) = events
    assert start.kind is EventKind.SPEECH_STARTED and start.window == 5 and i0 == 7
    assert end.kind is EventKind.ENDPOINT and end.window == 14 + 13 and not end.forced


def test_short_blip_is_not_speech():
    assert run([0.9, 0.9, 0.1, 0.1, 0.9, 0.1] + [0.0] * 30, min_speech_ms=96) == []


def test_pause_shorter_than_min_silence_does_not_end_turn():
    probs = [0.9] * 10 + [0.1] * 8 + [0.9] * 10 + [0.1] * 20
    kinds = [e.kind for _, e in run(probs, min_silence_ms=400)]
    assert kinds == [EventKind.SPEECH_STARTED, EventKind.ENDPOINT]


def test_uncertain_windows_neither_start_nor_end():
    # 0.4 is between neg_threshold and threshold: it neither counts as voice nor as silence.
    probs = [0.9] * 5 + [0.4] * 40
    kinds = [e.kind for _, e in run(probs, min_silence_ms=400)]
    assert kinds == [EventKind.SPEECH_STARTED]


def test_max_utterance_forces_an_endpoint():
    events = run([0.9] * 100, max_utterance_s=2.0)
    kinds = [e.kind for _, e in events]
    # speech continues after the forced cut, so a new utterance starts right away
    assert kinds == [EventKind.SPEECH_STARTED, EventKind.ENDPOINT, EventKind.SPEECH_STARTED]
    i, end = events[1]
    assert end.forced and i == 62  # 63 windows x 32 ms >= 2 s
