"""One Whisper shared by several workers (asr.shared): each worker gets exactly the transcript
its own Whisper would give, decodes from both are batched together, a dropped decode is not
answered, and a host that dies fails the open decodes at once; the workers reconnect to the next.
A host with a turn model judges pauses for every worker, as the worker's own model would."""

import asyncio
import logging
import threading
import time

import msgspec
import numpy as np
import pytest

from tests.conftest import wav
from voicert.config import load_config
from voicert.core.speech import FINAL, PARTIAL, SpeechUnavailable
from voicert.hosting import listen
from voicert.speech.asr import WhisperAsr
from voicert.speech.host import Hello, HostJudge, SharedAsr, host_judges, start_speech_host

KEY = b"test-key"


@pytest.fixture(scope="module")
def cfg():
    return load_config(environ={}).asr


@pytest.fixture()
def address(tmp_path):
    return str(tmp_path / "speech.sock")


def start(cfg, address, judge=None):
    host = start_speech_host(cfg, "embedded", address, KEY, judge=judge)
    host.wait_ready(300)
    return host


async def test_two_workers_get_their_own_whispers_transcripts_decoded_together(cfg, address):
    host = start(cfg, address)
    a, b = SharedAsr(address, KEY, 30), SharedAsr(address, KEY, 30)
    local = WhisperAsr(cfg, "embedded")
    try:
        france, germany = wav("capital_of_france")[0], wav("what_about_germany")[0]
        want = [local.transcribe_sync(france).text, local.transcribe_sync(germany).text]
        got = await asyncio.gather(
            a.transcribe(france, FINAL),
            b.transcribe(germany, FINAL),
            a.transcribe(germany, FINAL),
            b.transcribe(france, FINAL),
        )
        assert [t.text for t in got] == [want[0], want[1], want[1], want[0]]
        assert "france" in want[0].lower()
        assert all(t.ending is not None for t in got)  # Whisper's odds cross the seam too
        assert max(t.batch for t in got) >= 2  # two workers' utterances in one decode
        sizes: list[int] = []  # the host's figures come every 0.5 s, to one worker
        async with asyncio.timeout(60):
            while sum(sizes) < 4:
                await asyncio.sleep(0.1)
                sizes += a.drain_batch_sizes() + b.drain_batch_sizes()
        assert sum(sizes) == 4 and a.alive and b.alive and a.pending() == 0
    finally:
        local.close()
        a.close()
        b.close()
        host.stop()


async def test_a_dropped_decode_is_not_answered_and_the_next_one_is(cfg, address):
    host = start(cfg, address)
    a = SharedAsr(address, KEY, 30)
    try:
        audio = wav("count_to_five")[0]
        handles = [a.submit(audio, PARTIAL) for _ in range(6)]
        dropped = [h for h in handles[1:] if h.drop()]
        assert all(h.future.cancelled() for h in dropped)
        final = await a.transcribe(wav("capital_of_france")[0], FINAL)
        assert "france" in final.text.lower()
        assert (await handles[0].future).text  # taken before the drops: answered
    finally:
        a.close()
        host.stop()


async def test_a_host_that_dies_fails_open_decodes_and_the_workers_reconnect(cfg, address):
    host = start(cfg, address)
    a = SharedAsr(address, KEY, 30)
    try:
        long = np.tile(wav("count_to_five")[0], 6)[: 16000 * 29]
        pending = [a.submit(long, FINAL) for _ in range(8)]
        await asyncio.sleep(0.2)
        host.kill()
        results = await asyncio.gather(*(h.future for h in pending), return_exceptions=True)
        assert any(isinstance(r, SpeechUnavailable) and "went away" in str(r) for r in results)
        for _ in range(50):
            if not a.alive:
                break
            await asyncio.sleep(0.1)
        assert not a.alive
        with pytest.raises(SpeechUnavailable, match="unavailable"):
            await a.transcribe(long, FINAL)
        host = start(cfg, address)  # the primary starts another at the same address
        for _ in range(300):
            if a.alive:
                break
            await asyncio.sleep(0.1)
        assert a.alive
        assert "france" in (await a.transcribe(wav("capital_of_france")[0], FINAL)).text.lower()
    finally:
        a.close()
        host.stop()


def test_the_connected_line_is_said_only_once_the_connection_takes_work(address, caplog):
    # A supervisor (or tests/server/test_workers.py) waits for this line and then sends a turn:
    # by then the worker must be ready, not still reconnecting. No Whisper: a bare host that says
    # hello, hangs up, and says hello again on the next connection.
    listener = listen(address, KEY)
    accepted = []

    def host() -> None:
        for pid in (101, 102):
            conn = listener.accept()
            conn.send_bytes(msgspec.msgpack.encode(Hello(pid)))
            accepted.append(conn)
            if pid == 101:
                conn.close()  # the host goes away: the worker reconnects

    threading.Thread(target=host, daemon=True).start()
    holder: list[SharedAsr] = []
    alive_when_said: list[tuple[int, bool]] = []

    class Held(SharedAsr):  # held before it connects: its reader may reconnect (and say so)
        def __init__(self, *args) -> None:  # before the constructor has returned
            holder.append(self)
            super().__init__(*args)

    class Probe(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if record.getMessage().startswith("connected to the speech host"):
                alive_when_said.append((holder[0].pid, holder[0].alive))

    probe = Probe()
    logging.getLogger("voicert.speech.host").addHandler(probe)
    try:
        with caplog.at_level(logging.INFO, logger="voicert.speech.host"):
            Held(address, KEY, 10)
            deadline = time.monotonic() + 60  # (a wait for the reconnection, not a timing)
            while len(alive_when_said) < 2 and time.monotonic() < deadline:
                time.sleep(0.05)
        assert alive_when_said == [(101, True), (102, True)]
        assert [
            r.getMessage() for r in caplog.records if r.getMessage().startswith("connected")
        ] == ["connected to the speech host (pid 101)", "connected to the speech host (pid 102)"]
    finally:
        logging.getLogger("voicert.speech.host").removeHandler(probe)
        if holder:
            holder[0].close()
        listener.close()
        for conn in accepted:
            conn.close()


async def test_the_hosts_turn_model_judges_every_workers_pauses_as_their_own_would(cfg, address):
    from voicert.speech import smart_turn

    host = start(cfg, address, judge=("", "cpu", "auto"))
    a, b = SharedAsr(address, KEY, 30), SharedAsr(address, KEY, 30)
    try:
        clips = [wav("capital_of_france")[0], wav("count_to_five")[0][:16000]]
        got = await asyncio.gather(
            HostJudge(a).score(clips[0]), HostJudge(b).score(clips[1]), HostJudge(a).score(clips[1])
        )
        local = smart_turn.load("", "cpu", "auto")
        assert local.head is not None  # the shipped pause head, whose opinion comes along
        want = [local.opinions([c])[0] for c in (clips[0], clips[1], clips[1])]
        assert [g.complete for g in got] == pytest.approx([w.complete for w in want], abs=1e-5)
        assert [g.pause for g in got] == pytest.approx([w.pause for w in want], abs=1e-5)
    finally:
        a.close()
        b.close()
        host.stop()


async def test_a_host_without_a_turn_model_fails_a_judgement_and_says_why(cfg, address):
    host = start(cfg, address)
    a = SharedAsr(address, KEY, 30)
    try:
        with pytest.raises(RuntimeError, match="no turn model"):
            await HostJudge(a).score(np.zeros(16000, np.float32))
    finally:
        a.close()
        host.stop()


def test_the_host_judges_only_for_a_gpu_model_shared_by_several_workers():
    def cfg_with(**keys):
        return load_config(environ={}, overrides={k: str(v) for k, v in keys.items()})

    gpu = {
        "turn.detector": "hazard",
        "turn.model": "smart_turn",
        "turn.device": "cuda",
        "server.workers": 4,
        "asr.shared": "true",
    }
    assert host_judges(cfg_with(**gpu))
    assert not host_judges(cfg_with(**{**gpu, "turn.device": "cpu"}))
    assert not host_judges(cfg_with(**{**gpu, "server.workers": 1}))
    assert not host_judges(cfg_with(**{**gpu, "turn.detector": "silence"}))
    assert host_judges(
        cfg_with(**{**gpu, "turn.model": "auto"})
    )  # the hazard's: for its pause head
    assert not host_judges(cfg_with(**{**gpu, "turn.model": "auto", "turn.audio_head": "none"}))


def test_more_speech_hosts_on_cuda_than_gpus_is_a_config_error_naming_the_key():
    """``asr.hosts`` above 1 on cuda pins host i to GPU i, so the primary checks the count before
    it starts any (here a stand-in count: CI has no GPU); cpu, auto and one host need none."""
    from voicert.config import ConfigError
    from voicert.speech.host import check_speech_gpus

    over = {"asr.device": "cuda", "asr.hosts": 3, "asr.shared": True, "server.workers": 3}
    cuda3 = load_config(None, over).asr
    with pytest.raises(ConfigError, match=r"asr.hosts: 3 .* CTranslate2 sees 2; .* at most 2"):
        check_speech_gpus(cuda3, lambda: 2)
    with pytest.raises(ConfigError, match=r"sees 0; use asr.device: cpu"):
        check_speech_gpus(cuda3, lambda: 0)
    check_speech_gpus(cuda3, lambda: 3)  # one GPU each
    for device, hosts in (("cpu", 3), ("auto", 3), ("cuda", 1)):
        cfg = load_config(None, {**over, "asr.device": device, "asr.hosts": hosts}).asr
        check_speech_gpus(cfg, lambda: 0)  # (the count is not asked)
