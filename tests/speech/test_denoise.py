"""Input noise suppression (RNNoise from the pyrnnoise wheel): chunking does not change the
output, noise is suppressed, speech is kept."""

from __future__ import annotations

import importlib.metadata

import numpy as np
import pytest

from tests.conftest import wav

try:
    importlib.metadata.distribution("pyrnnoise")
except importlib.metadata.PackageNotFoundError:
    pytest.skip(
        "pyrnnoise is not installed (scripts/setup.sh test installs it)", allow_module_level=True
    )

from voicert.speech.denoise import RnNoise


def run(rn: RnNoise, x: np.ndarray, chunk: int) -> np.ndarray:
    d = rn.stream()
    out = np.concatenate([d(x[i : i + chunk]) for i in range(0, x.size, chunk)])
    d.close()
    return out


def db(x: np.ndarray) -> float:
    return 10 * np.log10(np.mean(x.astype(np.float64) ** 2) + 1e-12)


def test_the_output_does_not_depend_on_how_the_audio_is_chunked():
    rn = RnNoise()
    x, _ = wav("capital_of_france")
    a, b = run(rn, x, 320), run(rn, x, 1234)
    n = min(a.size, b.size)
    assert n > x.size - 1000
    np.testing.assert_allclose(a[:n], b[:n], atol=1e-5)


def test_noise_is_suppressed_and_speech_kept():
    rn = RnNoise()
    rng = np.random.default_rng(0)
    noise = (0.05 * rng.standard_normal(16000 * 2)).astype(np.float32)
    assert db(run(rn, noise, 320)[8000:]) < db(noise) - 15
    x, _ = wav("capital_of_france")
    assert db(run(rn, x, 320)) > db(x) - 6
