"""The window bench's own parts: where a pause utterance is cut, and the set it loads."""

import numpy as np

from voicert.bench.asr_window import EARLY_S, load_turns, pause_start


def tone(seconds: float) -> np.ndarray:
    t = np.arange(int(seconds * 16000), dtype=np.float32) / 16000
    return (0.3 * np.sin(2 * np.pi * 200 * t)).astype(np.float32)


def test_the_cut_is_at_the_longest_quiet_stretch_inside_the_utterance():
    gap = np.zeros(int(0.8 * 16000), np.float32)
    short = np.zeros(int(0.1 * 16000), np.float32)
    audio = np.concatenate(
        [tone(1.0), short, tone(0.5), gap, tone(1.0), np.zeros(16000, np.float32)]
    )
    cut = pause_start(audio)  # the trailing second of silence is not the pause
    assert abs(cut - int(1.6 * 16000)) <= 160


def test_the_pause_set_loads_with_first_halves_ending_in_the_early_decode_silence():
    complete, pauses = load_turns()
    assert len(complete) == 12 and len(pauses) == 12
    for p in pauses:
        assert p.first.size < p.whole.size and "|" not in p.text
        assert not p.first[-int(EARLY_S * 16000) :].any()


def test_a_window_outside_whispers_range_is_refused_before_any_model_loads(capsys):
    import pytest

    from voicert.bench.asr_window import main

    for bad in ("0", "31", "eight"):
        with pytest.raises(SystemExit) as exit_:
            main(["--windows", bad])
        assert exit_.value.code == 2 and "--windows" in capsys.readouterr().err


def test_the_round_trip_of_a_missing_folder_is_refused(capsys, tmp_path):
    import pytest

    from voicert.bench.tts import main

    with pytest.raises(SystemExit) as exit_:
        main(["--wer-of", str(tmp_path / "none")])
    assert exit_.value.code == 2 and "not a folder" in capsys.readouterr().err
