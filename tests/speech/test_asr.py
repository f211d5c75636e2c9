import numpy as np
import pytest

from tests.conftest import wav
from voicert.config import AsrConfig, ConfigError
from voicert.speech.asr import WhisperAsr, resolve_asr_model


@pytest.fixture(scope="module")
def asr():
    a = WhisperAsr(AsrConfig())
    yield a
    a.close()


def test_embedded_tiny_en_transcribes_the_question(asr):
    x, _ = wav("capital_of_france")
    t = asr.transcribe_sync(x)
    words = t.text.lower()
    assert "capital" in words and "france" in words
    assert t.audio_s == pytest.approx(x.size / 16000)


def test_silence_gives_no_text(asr):
    assert asr.transcribe_sync(np.zeros(16000 * 2, np.float32)).text == ""


async def test_transcribe_runs_off_the_event_loop(asr):
    import threading

    seen = []
    orig = asr.model.transcribe

    def spy(*a, **k):
        seen.append(threading.current_thread().name)
        return orig(*a, **k)

    asr.model.transcribe = spy
    try:
        x, _ = wav("what_about_germany")
        t = await asr.transcribe(x)
    finally:
        asr.model.transcribe = orig
    assert "germany" in t.text.lower()
    assert seen and seen[0].startswith("voicert-asr")


def test_bad_model_dir_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="not a CTranslate2 Whisper directory"):
        resolve_asr_model(str(tmp_path))
