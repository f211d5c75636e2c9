"""Shared fixtures: the real embedded models, loaded once, and a real server on 127.0.0.1."""

from __future__ import annotations

import difflib
import logging
from pathlib import Path

import pytest

from voicert.audio.wav import read_wav
from voicert.config import Config, load_config

DATA = Path(__file__).parent / "data"


def heard_the_answer(heard: str, answer=("capital", "france", "paris")) -> bool:
    """Whether Whisper heard the spoken answer. Whisper tiny.en mis-spells some of a neural voice's
    words, more so over a phone line ("francis perris"): each word must be heard closely (difflib
    ratio >= 0.7), not letter for letter. Silence or other words fail."""
    words = heard.lower().replace(".", " ").replace(",", " ").replace("?", " ").split()
    return all(
        any(difflib.SequenceMatcher(None, want, w).ratio() >= 0.7 for w in words) for want in answer
    )


def transformers_next_tokens(ref_model, prompt: list[int], ours: list[int]) -> list[int]:
    """transformers' greedy choice after each prefix of ``ours`` (len(ours) + 1 tokens: the
    last one follows the whole of ours), from one forward over prompt + ours. Greedy decoding picks
    every token from the tokens before it, so ``ours`` is what transformers' ``generate()`` gives
    exactly when ``transformers_next_tokens(...)[:-1] == ours``: the same check as running
    generate() for the reference, without its token-at-a-time cost on a busy CPU."""
    import torch

    ids = torch.tensor([prompt + ours])
    with torch.inference_mode():
        logits = ref_model(ids).logits[0, len(prompt) - 1 :]  # [len(ours) + 1, V]
    return logits.argmax(-1).tolist()


def transformers_guided_picks(simple, request, ours: list[int]) -> list[int | None]:
    """What the transformers engine (``simple``: a voicert.engine.clients.simple.SimpleEngine) picks after
    each prefix of ``ours`` under the request's grammar masks, from one forward over prompt +
    ours: its decode loop (greedy, then the guide's masked pick, then the guide advanced by the
    token kept), teacher-forced. len(ours) + 1 picks; the last is None where the grammar had
    finished after ours. ``ours`` is what the transformers engine gives exactly when the first
    len(ours) picks equal it and the last ends the reply (None, a stop token, or the budget
    reached), as with :func:`transformers_next_tokens`."""
    import torch

    from voicert.engine.core.tools import offered

    guide = simple.guides.for_request(request)
    prompt = simple.prompts.build(
        request.messages,
        simple.cfg.max_context_tokens - request.max_new_tokens,
        offered(request.tools, request.tool_choice),
    )
    with torch.inference_mode():
        logits = simple.model(input_ids=torch.tensor([prompt + ours])).logits[0, len(prompt) - 1 :]
    picks: list[int | None] = []
    for i, row in enumerate(logits):  # row: [V], the choice after ours[:i]
        if guide is not None and guide.finished:
            picks.append(None)
            break
        token = int(row.argmax())
        picks.append(guide.pick(token, row) if guide is not None else token)
        if i < len(ours) and guide is not None:
            guide.advance(ours[i])
    return picks


def wav(name: str):
    """(samples [N] float32, rate) of a test WAV."""
    return read_wav(DATA / f"{name}.wav")


@pytest.fixture(scope="session")
def cfg() -> Config:
    """The default config, but the Piper voice speaks a text the same way every time
    (``tts.variation: 0``): tests that have Whisper hear a reply judge one rendition, and Piper's
    noise makes an odd one now and then (over a phone line, "Paris" was heard as "Perez" in 2 of
    80 renditions). The audio turn model is loaded (``turn.model: smart_turn``) for the semantic
    detector's tests and the hazard's with it; the default hazard runs without it, and its
    tests say ``model: none``. Admission is off (``server.admission``): CI's cores are busy with
    other work, and a door that closes on the server's lag would refuse the next test's session;
    tests/server/test_admission.py runs it."""
    return load_config(
        environ={},
        overrides={"tts.variation": 0.0, "turn.model": "smart_turn", "server.admission": False},
    )


@pytest.fixture(scope="session")
def services(cfg):
    from voicert.server.app import load_services

    logging.getLogger("faster_whisper").setLevel(logging.WARNING)
    svc = load_services(cfg)
    yield svc
    svc.engine.close()
    svc.asr.close()
    if svc.tts is not None:
        svc.tts.close()


async def server_with(services, **server):
    """A started real server on a free port with the loaded models and these ``server`` keys
    changed (the caller shuts it down). Admission is off unless asked for: see ``server``."""
    import dataclasses

    server.setdefault("admission", False)
    from voicert.server.app import VoiceServer

    cfg = services.cfg
    srv = VoiceServer(
        dataclasses.replace(
            services,
            cfg=dataclasses.replace(cfg, server=dataclasses.replace(cfg.server, port=0, **server)),
        )
    )
    await srv.start()
    return srv


@pytest.fixture(scope="session")
async def server(services):
    """A real server on 127.0.0.1 (a free port) sharing the loaded models; 64 KiB frame limit.
    Turns end by silence (``turn.detector: silence``) here: the tests on it send a fixed trailing
    silence and are about other things. The judging detectors (semantic, and hazard, the default)
    have their own tests
    (tests/agent/test_turns_semantic.py, test_session_semantic.py, and over real models in
    tests/agent/test_session.py). Admission (``server.admission``) is off: CI's cores are busy
    with other work, and a door that closes on its lag would refuse the next test's session;
    its own tests run it (tests/server/test_admission.py)."""
    import dataclasses

    from voicert.server.app import VoiceServer

    cfg = services.cfg
    srv = VoiceServer(
        dataclasses.replace(
            services,
            cfg=dataclasses.replace(
                cfg,
                server=dataclasses.replace(
                    cfg.server, port=0, max_message_bytes=64 * 1024, admission=False
                ),
                turn=dataclasses.replace(cfg.turn, detector="silence"),
            ),
        )
    )
    await srv.start()
    yield srv
    await srv.shutdown()


@pytest.fixture
def url(server):
    from voicert.server.app import STREAM_PATH

    return f"ws://127.0.0.1:{server.port}{STREAM_PATH}"
