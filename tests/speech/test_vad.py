import numpy as np
import pytest

from tests.conftest import wav
from voicert.audio.pcm import StreamResampler
from voicert.speech.vad import FRAME, SileroVad, VadStream


@pytest.fixture(scope="module")
def model():
    return SileroVad()


def test_speech_scores_high_and_silence_low(model):
    x, rate = wav("capital_of_france")
    assert rate == 16000
    audio = np.concatenate([np.zeros(16000, np.float32), x, np.zeros(16000, np.float32)])
    probs = VadStream(model).push(audio)
    assert probs.size == audio.size // FRAME
    assert probs[:25].max() < 0.2  # the leading second of silence
    assert (probs[35:80] > 0.5).mean() > 0.6  # the spoken question
    assert probs[-25:].max() < 0.2


def test_streaming_is_independent_of_chunk_size(model):
    x, _ = wav("capital_of_france")
    whole = VadStream(model).push(x)
    s = VadStream(model)
    parts = np.concatenate([s.push(x[i:i + 320]) for i in range(0, x.size, 320)])
    np.testing.assert_allclose(parts, whole, atol=1e-5)


def test_noise_is_not_speech(model):
    rng = np.random.default_rng(0)
    noise = (0.05 * rng.standard_normal(16000 * 2)).astype(np.float32)
    assert (VadStream(model).push(noise) > 0.5).mean() < 0.05


def test_resampled_48k_speech_is_detected(model):
    import soxr

    x, _ = wav("capital_of_france")
    x48 = soxr.resample(x, 16000, 48000).astype(np.float32)
    y = StreamResampler(48000)(x48)
    assert (VadStream(model).push(y) > 0.5).mean() > 0.4
