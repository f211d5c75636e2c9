"""The embedded eSpeak NG voice and the TTS worker thread (real library, no mocks)."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from voicert.config import ConfigError, TtsConfig
from voicert.speech.tts import EspeakVoice, TtsError, TtsJob, TtsWorker, load_voice


class ToneVoice:
    """A plug-in voice (what a neural voice on disk would implement): one 440 Hz beep per word,
    in 10 ms chunks, so tests can count and stop it."""

    sample_rate = 16000

    def __init__(self, cfg: TtsConfig) -> None:
        self.spoken: list[str] = []

    def synthesize(self, text, on_chunk):
        self.spoken.append(text)
        t = np.arange(1600) / self.sample_rate
        beep = (0.3 * np.sin(2 * np.pi * 440 * t)).astype(np.float32)
        for _ in text.split():
            for i in range(0, beep.size, 160):
                if not on_chunk(beep[i:i + 160]):
                    return
                time.sleep(0.001)


def run_job(worker, text, index=0):
    chunks, done = [], threading.Event()
    job = worker.submit(TtsJob(text, chunks.append, lambda err: done.set()), index)
    return job, chunks, done


def test_espeak_speaks_in_small_chunks_at_its_rate():
    voice = load_voice(TtsConfig(engine="espeak"))
    assert isinstance(voice, EspeakVoice) and voice.sample_rate == 22050
    chunks = []
    voice.synthesize("The capital of France is Paris.", lambda c: chunks.append(c) or True)
    audio = np.concatenate(chunks)
    assert len(chunks) > 5 and max(c.size for c in chunks) <= 22050 * 0.1  # streamed, not one blob
    assert 1.0 < audio.size / 22050 < 3.0  # about 1.7 s of speech
    assert audio.dtype == np.float32 and 0.05 < np.abs(audio).max() <= 1.0


def test_espeak_stops_when_asked_and_rejects_unknown_voices():
    voice = load_voice(TtsConfig(engine="espeak"))
    chunks = []
    voice.synthesize("One two three four five six seven eight nine ten.",
                     lambda c: chunks.append(c) or len(chunks) < 2)
    assert len(chunks) == 2
    with pytest.raises(TtsError, match="no voice"):
        EspeakVoice(TtsConfig(voice="xx-nope"))
    load_voice(TtsConfig(engine="espeak"))  # the default voice is selected again for later tests


def test_plugin_voice_by_dotted_path_and_bad_config():
    voice = load_voice(TtsConfig(engine="tests.speech.test_tts:ToneVoice"))
    assert type(voice).__name__ == "ToneVoice" and voice.sample_rate == 16000  # imported by path
    assert load_voice(TtsConfig(engine="none")) is None
    with pytest.raises(TtsError, match="cannot import"):
        load_voice(TtsConfig(engine="tests.speech.test_tts:Nope"))
    with pytest.raises(ConfigError, match="tts.engine"):
        TtsConfig(engine="festival")


def test_worker_speaks_first_pieces_first_and_cancel_stops_a_running_piece():
    voice = ToneVoice(TtsConfig())
    worker = TtsWorker(voice)
    try:
        gate = threading.Event()
        blocker = worker.submit(TtsJob("hold", lambda c: gate.wait(5), lambda e: None), 0)
        _, _, late_done = run_job(worker, "second piece of reply A", index=1)
        _, _, first_done = run_job(worker, "first piece of reply B", index=0)
        gate.set()
        assert first_done.wait(10) and late_done.wait(10)
        assert voice.spoken[1:] == ["first piece of reply B", "second piece of reply A"]
        assert blocker.cancelled is False
        job, chunks, done = run_job(worker, " ".join(["word"] * 50))  # ~5 s of beeps
        while not chunks:
            time.sleep(0.005)
        job.cancel()
        assert done.wait(5)
        assert len(chunks) < 50 * 10  # stopped well before the end
        queued, qchunks, qdone = run_job(worker, "never spoken")
        queued.cancel()
        assert qdone.wait(5) and qchunks == []
    finally:
        worker.close()


def test_the_configured_voice_comes_first_then_the_extras_and_a_bad_extra_names_its_key():
    from voicert.speech.tts import load_voices

    voices = load_voices(TtsConfig(engine="espeak", voices=["en-gb-x-rp", "en-us+f3", "en-us"]))
    assert list(voices) == ["en-us", "en-gb-x-rp", "en-us+f3"]  # the default once, first
    assert all(isinstance(v, EspeakVoice) for v in voices.values())
    assert load_voices(TtsConfig(engine="none", voices=["en"])) == {}
    with pytest.raises(TtsError, match=r"tts.voices\[1\]: eSpeak NG has no voice 'xx-nope'"):
        load_voices(TtsConfig(engine="espeak", voices=["en", "xx-nope"]))
    load_voice(TtsConfig(engine="espeak"))  # the default voice is selected again for later tests


def median_f0(x: np.ndarray, rate: int) -> float:
    """The median pitch (Hz) of the voiced 40 ms frames, by autocorrelation."""
    n, pitches = int(0.04 * rate), []
    for i in range(0, x.size - n, n):
        frame = x[i:i + n] - x[i:i + n].mean()
        if np.sqrt((frame ** 2).mean()) < 0.02:
            continue
        ac = np.correlate(frame, frame, "full")[n - 1:]
        lo, hi = rate // 400, rate // 70
        lag = lo + int(np.argmax(ac[lo:hi]))
        if ac[lag] > 0.3 * ac[0]:
            pitches.append(rate / lag)
    return float(np.median(pitches))


def test_each_job_speaks_in_its_own_voice_and_an_unknown_voice_fails_that_job_only():
    from voicert.speech.tts import load_voices

    worker = TtsWorker(load_voices(TtsConfig(engine="espeak", voices=["en-us+f3"])))
    try:
        assert worker.default_voice == "en-us" and worker.rate_of("en-us+f3") == 22050
        heard = {}
        for voice in (None, "en-us+f3", "en-us"):
            chunks, done = [], threading.Event()
            worker.submit(TtsJob("The capital of France is Paris.", chunks.append,
                                 lambda err: done.set(), voice), 0)
            assert done.wait(30)
            heard[voice] = median_f0(np.concatenate(chunks), 22050)
        assert max(heard[None], heard["en-us"]) < 150 < heard["en-us+f3"]  # male, male, female
        errors, done = [], threading.Event()
        worker.submit(TtsJob("Hello.", lambda c: None,
                             lambda err: errors.append(err) or done.set(), "xx"), 0)
        assert done.wait(30) and isinstance(errors[0], KeyError)
        _, chunks, done = run_job(worker, "Still here.")
        assert done.wait(30) and chunks  # the worker lives on
    finally:
        worker.close()
        load_voice(TtsConfig(engine="espeak"))


def test_a_pool_gives_a_new_reply_the_idle_thread_so_it_is_not_held_up_by_a_running_one():
    from voicert.speech.tts import TtsPool

    voice = ToneVoice(TtsConfig())
    pool = TtsPool({"tone": voice}, workers=2)
    try:
        gate = threading.Event()
        first = pool.lane()
        first.submit(TtsJob("hold", lambda c: gate.wait(5), lambda e: None), 0)  # running, blocked
        second = pool.lane()
        assert second is not first  # the busy thread is not picked
        _, chunks, done = run_job(second, "spoken meanwhile")
        assert done.wait(5) and chunks and not gate.is_set()  # done while the first still speaks
        gate.set()
        assert pool.alive and pool.rate_of(None) == 16000 and pool.default_voice == "tone"
    finally:
        pool.close()
    assert not pool.alive


def test_one_thread_keeps_the_old_behaviour():
    from voicert.speech.tts import TtsPool

    pool = TtsPool({"tone": ToneVoice(TtsConfig())}, workers=1)
    try:
        assert pool.lane() is pool.lane() is pool.workers[0]
    finally:
        pool.close()
