"""The end-of-turn set's renderings (bench/turn_set.py): the pause is cut in where the text marks
it, and as long as asked; the conditions keep the timing."""

import numpy as np
import pytest

from voicert.bench.turn_set import (
    COMPLETE_ITEMS,
    PAUSE_ITEMS,
    SAMPLE_RATE,
    phone_line,
    pink_noise,
    render_set,
)


def silent_runs(x: np.ndarray, min_ms: int = 200) -> list[tuple[int, int]]:
    """(start, length) in ms of runs of 10 ms frames with no sample above 0.01."""
    frames = np.abs(x[: x.size // 160 * 160].reshape(-1, 160)).max(axis=1) <= 0.01
    runs, start = [], None
    for i, quiet in enumerate(np.append(frames, False)):
        if quiet and start is None:
            start = i
        elif not quiet and start is not None:
            if (i - start) * 10 >= min_ms:
                runs.append((start * 10, (i - start) * 10))
            start = None
    return runs


def test_the_set_has_enough_of_each_kind():
    assert len(PAUSE_ITEMS) >= 60 and len(COMPLETE_ITEMS) >= 60  # each spoken by two voices
    assert all("|" in i.text for i in PAUSE_ITEMS)


def test_piper_speaks_the_sentence_with_the_pause_cut_in_at_the_marked_word():
    pytest.importorskip("piper")
    item = PAUSE_ITEMS[0]  # "I would like to book a table for | four people tonight."
    piper = [r for r in render_set(("clean",), [item]) if r.voice.startswith("piper")]
    (r,) = piper
    ((start, length),) = silent_runs(r.audio)
    assert abs(length - r.pause_ms) <= 30
    words_before = 8 / 11  # the pause comes after 8 of the 11 words
    assert 0.5 < start / (r.end * 1000 / SAMPLE_RATE) < words_before + 0.1
    assert r.audio.size - r.end < SAMPLE_RATE // 50  # no silence after the last word (20 ms)


def test_the_conditions_keep_the_length_and_the_noise_its_level():
    x = np.sin(np.arange(SAMPLE_RATE) * 0.05).astype(np.float32) * 0.3
    assert abs(phone_line(x).size - x.size) <= 2
    noise = pink_noise(SAMPLE_RATE, seed=1)
    assert np.sqrt(np.mean(noise**2)) == pytest.approx(1.0, rel=1e-3)
    assert np.array_equal(noise, pink_noise(SAMPLE_RATE, seed=1))


def test_a_speakers_consecutive_segments_make_one_turn():
    from voicert.bench.turn_set import _speaker_turns

    stm = (
        "call 1 Ann 1.0 1.5 Hello?\n"
        "call 1 Bob 1.8 2.2 Hi.\n"
        "call 1 Bob 2.3 3.0 How are you?\n"
        "call 1 Ann 3.4 4.0 Fine.\n"
    )
    assert _speaker_turns(stm) == [
        ("Ann", 1.0, 1.5, "Hello?"),
        ("Bob", 1.8, 3.0, "Hi. How are you?"),
        ("Ann", 3.4, 4.0, "Fine."),
    ]


def test_an_item_keeps_its_voice_and_pause_whichever_subset_is_rendered():
    pytest.importorskip("piper")
    from voicert.bench.turn_set import ITEMS, PAUSES_MS, PIPER_SCALES

    n = 70  # an item of the second batch
    (r,) = [r for r in render_set(("clean",), [ITEMS[n]]) if r.voice.startswith("piper")]
    assert r.pause_ms == PAUSES_MS[n % len(PAUSES_MS)]
    assert r.voice == f"piper:joe@{PIPER_SCALES[n % 3]}"


def test_a_noisy_lines_noise_goes_on_through_the_silence_around_the_turn():
    from voicert.bench.turn_set import ITEMS, Rendering

    speech = np.sin(np.arange(SAMPLE_RATE) * 0.05).astype(np.float32) * 0.3
    noisy = Rendering(
        "c01-piper-noisy", ITEMS[0], "piper:joe@1.0", 300, "noisy", speech, 16000, 0.02
    )
    x = noisy.padded(800, 1600)
    assert x.size == 800 + speech.size + 1600
    assert np.array_equal(x[800:-1600], speech)
    tail = x[-1600:]
    assert np.sqrt(np.mean(tail**2)) == pytest.approx(0.02, rel=0.2)  # noise, not digital silence
    clean = Rendering("c01-piper-clean", ITEMS[0], "piper:joe@1.0", 300, "clean", speech, 16000)
    assert not clean.padded(800, 1600)[-1600:].any()


def test_renderings_keep_their_noise_level_through_a_file(tmp_path):
    from voicert.bench.turn_set import ITEMS, Rendering, load_renderings, save_renderings

    speech = np.sin(np.arange(1600) * 0.05).astype(np.float32) * 0.3
    r = Rendering("p01-piper-noisy", ITEMS[0], "piper:joe@1.0", 300, "noisy", speech, 1600, 0.02)
    save_renderings([r], tmp_path / "r.npz")
    (back,) = load_renderings(tmp_path / "r.npz")
    assert back.noise_rms == pytest.approx(0.02)
