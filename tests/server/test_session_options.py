"""A native session's own turn-taking options (``end_of_turn``, ``silence_ms``, ``vad_threshold``)
become that session's VAD and turn settings; the server's stay as they are for everyone else."""

import dataclasses
from types import SimpleNamespace

import pytest

from voicert.config import load_config
from voicert.protocol import native as p
from voicert.server.connection import session_turn_taking

_A_JUDGE = object()


def services(detector="semantic", judge=_A_JUDGE):
    cfg = load_config(environ={})
    cfg = dataclasses.replace(cfg, turn=dataclasses.replace(cfg.turn, detector=detector))
    return SimpleNamespace(cfg=cfg, turn_judge=judge)


def test_no_options_keep_the_servers_settings():
    svc = services()
    assert session_turn_taking(p.SessionStart(), svc) == (svc.cfg.vad, svc.cfg.turn)


def test_silence_ms_is_the_endpoint_with_the_silence_detector_and_the_longest_wait_with_semantic():
    svc = services()
    vad, turn = session_turn_taking(p.SessionStart(end_of_turn="silence", silence_ms=900), svc)
    assert turn.detector == "silence" and vad.min_silence_ms == 900
    vad, turn = session_turn_taking(p.SessionStart(silence_ms=2500), svc)
    assert turn.detector == "semantic" and turn.max_silence_ms == 2500
    assert vad.min_silence_ms == svc.cfg.vad.min_silence_ms
    assert svc.cfg.turn.max_silence_ms == 1600  # the server's own, unchanged


def test_a_lower_vad_threshold_lowers_the_silence_threshold_with_it():
    vad, _ = session_turn_taking(p.SessionStart(vad_threshold=0.2), services())
    assert vad.threshold == 0.2 and vad.neg_threshold == 0.2


def test_semantic_without_the_audio_model_judges_by_the_transcript():
    _, turn = session_turn_taking(
        p.SessionStart(end_of_turn="semantic"), services(detector="silence", judge=None)
    )
    assert turn.detector == "semantic" and turn.model == "none" and turn.text_cue


def test_a_wait_shorter_than_the_judging_pause_is_an_invalid_message():
    with pytest.raises(p.ProtocolError, match="turn.max_silence_ms") as err:
        session_turn_taking(p.SessionStart(silence_ms=100), services())
    assert err.value.code == p.ErrorCode.INVALID
