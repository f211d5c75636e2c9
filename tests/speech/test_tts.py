"""The embedded eSpeak NG voice and the TTS worker thread (real library, no mocks)."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from voicert.config import ConfigError, TtsConfig
from voicert.speech.tts import EspeakVoice, PluginVoice, TtsError, TtsJob, TtsWorker, load_voice
from voicert.speech.worker import WorkerClosed


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
                if not on_chunk(beep[i : i + 160]):
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
    voice.synthesize(
        "One two three four five six seven eight nine ten.",
        lambda c: chunks.append(c) or len(chunks) < 2,
    )
    assert len(chunks) == 2
    with pytest.raises(TtsError, match="no voice"):
        EspeakVoice(TtsConfig(voice="xx-nope"))
    load_voice(TtsConfig(engine="espeak"))  # the default voice is selected again for later tests


def test_plugin_voice_by_dotted_path_and_bad_config():
    voice = load_voice(TtsConfig(engine="tests.speech.test_tts:ToneVoice"))
    assert isinstance(voice, PluginVoice) and type(voice.inner).__name__ == "ToneVoice"  # by path
    assert voice.sample_rate == 16000 and voice.voice_id == "ToneVoice"
    assert voice.name == "tests.speech.test_tts:ToneVoice"
    assert load_voice(TtsConfig(engine="none")) is None
    with pytest.raises(TtsError, match="cannot import"):
        load_voice(TtsConfig(engine="tests.speech.test_tts:Nope"))
    with pytest.raises(ConfigError, match="tts.engine"):
        TtsConfig(engine="festival")


class NamedVoice(ToneVoice):
    """A plug-in voice with a name, an id and a warm-up of its own."""

    name = "Tone, named"
    voice_id = "tone-1"

    def __init__(self, cfg: TtsConfig) -> None:
        super().__init__(cfg)
        self.warmed = 0

    def warmup(self):
        self.warmed += 1


class MuteVoice:
    sample_rate = 16000  # (no synthesize)

    def __init__(self, cfg: TtsConfig) -> None:
        pass


class RatelessVoice(ToneVoice):
    sample_rate = 16000.0


def test_a_plugin_voice_gets_what_it_lacks_and_keeps_what_it_has():
    """A plug-in needs only an integer sample_rate and synthesize: without them loading it is a
    config error naming tts.engine; its name, voice id and warm-up are used where it has them,
    and its first pieces go through synthesize where it has no synthesize_first."""
    for cls, why in (("MuteVoice", "no synthesize"), ("RatelessVoice", "no integer sample_rate")):
        with pytest.raises(TtsError, match=f"tts.engine .*{cls}.*{why}"):
            load_voice(TtsConfig(engine=f"tests.speech.test_tts:{cls}"))
    voice = load_voice(TtsConfig(engine="tests.speech.test_tts:NamedVoice"))
    assert isinstance(voice, PluginVoice)
    assert (voice.name, voice.voice_id) == ("Tone, named", "tone-1")
    worker = TtsWorker(voice)
    try:
        assert list(worker.voices) == ["tone-1"]
        worker.warmup()
        assert voice.inner.warmed == 1
        _, chunks, done = run_job(worker.lane(), "one two", 0)  # a first piece
        assert done.wait(5) and len(chunks) == 20 and voice.inner.spoken[-1] == "one two"
    finally:
        worker.close()


def test_worker_speaks_first_pieces_first_and_cancel_stops_a_running_piece():
    voice = ToneVoice(TtsConfig())
    worker = TtsWorker(PluginVoice(voice, "tone"))
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
        frame = x[i : i + n] - x[i : i + n].mean()
        if np.sqrt((frame**2).mean()) < 0.02:
            continue
        ac = np.correlate(frame, frame, "full")[n - 1 :]
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
            worker.submit(
                TtsJob(
                    "The capital of France is Paris.", chunks.append, lambda err: done.set(), voice
                ),
                0,
            )
            assert done.wait(30)
            heard[voice] = median_f0(np.concatenate(chunks), 22050)
        assert max(heard[None], heard["en-us"]) < 150 < heard["en-us+f3"]  # male, male, female
        errors, done = [], threading.Event()
        worker.submit(
            TtsJob("Hello.", lambda c: None, lambda err: errors.append(err) or done.set(), "xx"), 0
        )
        assert done.wait(30) and isinstance(errors[0], KeyError)
        _, chunks, done = run_job(worker, "Still here.")
        assert done.wait(30) and chunks  # the worker lives on
    finally:
        worker.close()
        load_voice(TtsConfig(engine="espeak"))


def test_a_first_piece_takes_whichever_thread_frees_first():
    # two threads, both speaking other replies; a new reply's first piece goes to the thread
    # that frees first (one queue), not to one picked when the reply began
    voice = ToneVoice(TtsConfig())
    worker = TtsWorker({"tone": PluginVoice(voice, "tone")}, threads=2)
    try:
        gate_a, gate_c = threading.Event(), threading.Event()
        worker.lane().submit(TtsJob("hold a", lambda c: gate_a.wait(5), lambda e: None), 0)
        worker.lane().submit(TtsJob("hold c", lambda c: gate_c.wait(5), lambda e: None), 0)
        while len(voice.spoken) < 2:  # both threads busy
            time.sleep(0.001)
        _, chunks, done = run_job(worker.lane(), "new reply")
        gate_c.set()
        assert done.wait(5) and chunks and not gate_a.is_set()  # spoken while A still holds
        gate_a.set()
        assert worker.alive and worker.threads == 2 and worker.rate_of(None) == 16000
    finally:
        worker.close()
    assert not worker.alive


class OverlapVoice(ToneVoice):
    """Records which pieces ran at the same time as another piece of the same reply."""

    def __init__(self, cfg) -> None:
        super().__init__(cfg)
        self.lock = threading.Lock()
        self.running: dict[str, int] = {}
        self.overlaps: list[str] = []
        self.threads: set[str] = set()

    def synthesize(self, text, on_chunk):
        reply = text.split()[0]
        with self.lock:
            self.threads.add(threading.current_thread().name)
            if self.running.get(reply):
                self.overlaps.append(text)
            self.running[reply] = self.running.get(reply, 0) + 1
        try:
            super().synthesize(text, on_chunk)
        finally:
            with self.lock:
                self.running[reply] -= 1


def test_a_replys_pieces_are_spoken_one_after_another_in_order_over_several_threads():
    voice = OverlapVoice(TtsConfig())
    worker = TtsWorker({"tone": PluginVoice(voice, "tone")}, threads=3)
    try:
        lanes = {r: worker.lane() for r in "abc"}
        heard = {r: [] for r in lanes}
        done = threading.Event()
        left = [3 * 6]

        def finished(err):
            left[0] -= 1
            if left[0] == 0:
                done.set()

        for i in range(6):  # all pieces queued at once, interleaved across three replies
            for r, lane in lanes.items():
                text = f"{r} piece {i}"
                lane.submit(
                    TtsJob(text, lambda c, r=r, text=text: heard[r].append(text), finished), i
                )
        assert done.wait(30)
        assert voice.overlaps == []  # never two pieces of one reply at once
        for r in lanes:  # each reply's chunks in piece order
            said = [t for i, t in enumerate(heard[r]) if i == 0 or heard[r][i - 1] != t]
            assert said == [f"{r} piece {i}" for i in range(6)]
        assert len(voice.threads) > 1  # the replies did share the threads
    finally:
        worker.close()


def test_closing_fails_a_replys_held_pieces_in_order():
    worker = TtsWorker({"tone": PluginVoice(ToneVoice(TtsConfig()), "tone")}, threads=2)
    gate, started = threading.Event(), threading.Event()
    errors: list = []
    lane = worker.lane()
    lane.submit(
        TtsJob(
            "hold", lambda c: started.set() or gate.wait(5), lambda e: errors.append(("hold", e))
        ),
        0,
    )
    for i in (1, 2):
        lane.submit(TtsJob(f"piece {i}", lambda c: None, lambda e, i=i: errors.append((i, e))), i)
    assert started.wait(5)  # the first piece is being spoken; the other two are held
    closer = threading.Thread(target=worker.close)
    closer.start()
    gate.set()
    closer.join(10)
    assert [k for k, _ in errors] == ["hold", 1, 2]
    assert errors[0][1] is None and all(isinstance(e, WorkerClosed) for _, e in errors[1:])
    with pytest.raises(WorkerClosed):
        worker.lane().submit(TtsJob("late", lambda c: None, lambda e: None), 0)


class UrgentVoice(ToneVoice):
    """A voice with a way of its own for a reply's first piece."""

    def __init__(self, cfg: TtsConfig) -> None:
        super().__init__(cfg)
        self.first: list[str] = []

    def synthesize_first(self, text, on_chunk):
        self.first.append(text)
        self.synthesize(text, on_chunk)


def test_a_replys_first_piece_goes_to_the_voices_first_piece_path_and_the_rest_do_not():
    voice = UrgentVoice(TtsConfig())
    worker = TtsWorker({"urgent": PluginVoice(voice, "urgent")}, threads=2)
    try:
        lane = worker.lane()
        dones = [run_job(lane, text, i)[2] for i, text in enumerate(["first one", "then two"])]
        assert all(d.wait(5) for d in dones)
        assert voice.first == ["first one"] and voice.spoken == ["first one", "then two"]
        _, _, done = run_job(
            TtsWorker({"tone": PluginVoice(ToneVoice(TtsConfig()), "t")}), "no such path"
        )
        assert done.wait(5)  # a voice without it speaks first pieces the one way it has
    finally:
        worker.close()
