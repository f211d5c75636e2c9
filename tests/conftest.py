"""Shared fixtures: the real embedded models, loaded once, and a real server on 127.0.0.1."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from voicert.audio.wav import read_wav
from voicert.config import Config, load_config

DATA = Path(__file__).parent / "data"


def wav(name: str):
    """(samples [N] float32, rate) of a test WAV."""
    return read_wav(DATA / f"{name}.wav")


@pytest.fixture(scope="session")
def cfg() -> Config:
    return load_config(environ={})


@pytest.fixture(scope="session")
def services(cfg):
    from voicert.server.app import load_services

    logging.getLogger("faster_whisper").setLevel(logging.WARNING)
    svc = load_services(cfg)
    yield svc
    svc.engine.close()
    svc.asr.close()
