import numpy as np
import pytest

from tests.conftest import wav
from voicert.config import ConfigError
from voicert.speech.asr import pad_mel, resolve_asr_model


@pytest.fixture(scope="module")
def asr(services):
    return services.asr  # the one ASR worker of the test session


def test_embedded_tiny_en_transcribes_the_question(asr):
    x, _ = wav("capital_of_france")
    t = asr.transcribe_sync(x)
    words = t.text.lower()
    assert "capital" in words and "france" in words
    assert t.audio_s == pytest.approx(x.size / 16000)


def test_silence_gives_no_text(asr):
    assert asr.transcribe_sync(np.zeros(16000 * 2, np.float32)).text == ""


async def test_transcribe_runs_on_the_worker_thread_not_the_loop(asr):
    import threading

    seen = []
    orig = asr.decode_batch

    def spy(audios, ending=True):
        seen.append((threading.current_thread().name, len(audios)))
        return orig(audios, ending)

    asr.decode_batch = spy
    try:
        x, _ = wav("what_about_germany")
        t = await asr.transcribe(x)
    finally:
        asr.decode_batch = orig
    assert "germany" in t.text.lower()
    assert seen == [("voicert-asr", 1)]


async def test_batched_decode_equals_one_at_a_time(asr):
    clips = [wav(n)[0] for n in ("capital_of_france", "what_about_germany", "count_to_five")]
    alone = [asr.transcribe_sync(x).text for x in clips]
    together = asr.decode_batch(clips)
    assert [t.text for t in together] == alone
    assert all(t.batch == 3 for t in together)


class HeldWorker:
    """Spies on ``asr.decode_batch`` (its batch sizes, in ``order``) and holds the worker in its
    first decode until :meth:`release`, so jobs submitted meanwhile queue however loaded the
    machine is (a sleep would only make that likely)."""

    def __init__(self, asr):
        import threading

        self.asr, self.orig, self.order = asr, asr.decode_batch, []
        self.started, self.released = threading.Event(), threading.Event()

    def decode_batch(self, audios, ending=True):
        self.order.append(len(audios))
        if len(self.order) == 1:
            self.started.set()
            self.released.wait(120)
        return self.orig(audios, ending)

    async def busy(self) -> None:
        """Returns once the worker is inside its first decode."""
        import asyncio

        assert await asyncio.to_thread(self.started.wait, 120), "the worker never started"

    def release(self) -> None:
        self.released.set()

    def __enter__(self):
        self.asr.decode_batch = self.decode_batch
        return self

    def __exit__(self, *exc):
        self.release()
        self.asr.decode_batch = self.orig


async def test_worker_batches_queued_jobs_and_serves_finals_first(asr):
    """Jobs queued while the worker is busy are taken together, finals before early decodes."""
    import asyncio

    from voicert.core.speech import EARLY, FINAL

    clips = [wav(n)[0] for n in ("capital_of_france", "what_about_germany", "count_to_five")]
    with HeldWorker(asr) as worker:
        blocker = asr.submit(clips[0], FINAL)
        await worker.busy()
        early = asr.submit(clips[1], EARLY)
        finals = [asr.submit(c, FINAL) for c in clips[1:]]
        worker.release()
        done = await asyncio.gather(blocker.future, *(h.future for h in finals), early.future)
    assert worker.order == [1, 2, 1]  # the two finals together, then the early one
    assert "germany" in done[1].text.lower() and done[2].batch == 2 and done[3].batch == 1


async def test_a_queued_job_can_be_dropped(asr):
    x, _ = wav("capital_of_france")
    with HeldWorker(asr) as worker:
        busy = asr.submit(x)
        await worker.busy()
        queued = asr.submit(x)
        assert queued.drop() and queued.future.cancelled()
        assert not busy.drop()  # being decoded: too late to withdraw
        worker.release()
        await busy.future
    assert worker.order == [1]  # the dropped job was never decoded
    assert not busy.drop()  # already decoded: nothing to withdraw


def test_bad_model_dir_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="not a CTranslate2 Whisper directory"):
        resolve_asr_model(str(tmp_path))


def test_the_encoder_window_fits_the_utterance_but_never_under_its_minimum():
    from voicert.config import AsrConfig
    from voicert.speech.asr import window_frames

    short = AsrConfig(min_window_s=8, window_pad_s=1)
    assert window_frames(250, short) == 800  # 2.5 s of speech: the 8 s minimum
    assert window_frames(1230, short) == 1400  # 12.3 s + 1 s of silence, in whole seconds
    assert window_frames(2990, short) == 3000  # never past Whisper's 30 s
    assert window_frames(250, AsrConfig(min_window_s=30)) == 3000  # as trained


def test_a_shortened_window_runs_a_shorter_encoder_pass_and_still_transcribes(services):
    import dataclasses

    from voicert.speech.asr import WhisperAsr

    short = WhisperAsr(dataclasses.replace(services.cfg.asr, min_window_s=8))
    try:
        x, _ = wav("count_to_five")
        enc = short.model.encode(np.zeros((1, 80, 800), np.float32))
        assert enc.shape[1] == 400  # 8 s of mel frames, not Whisper's 1500 positions
        assert "count" in short.transcribe_sync(x).text.lower()
    finally:
        short.close()


def test_generation_is_bounded_by_the_audio_length():
    from voicert.speech.asr import max_tokens

    assert max_tokens(1.0, 4) == 24  # a short answer cannot run away for 224 tokens
    assert max_tokens(3.2, 4) == 46
    assert max_tokens(30.0, 4) == 224


def test_the_window_is_padded_as_if_the_audio_went_on_in_silence():
    """What Whisper was trained on: the log-mel of the clip followed by digital silence."""
    from faster_whisper.feature_extractor import FeatureExtractor

    fe = FeatureExtractor()
    x, _ = wav("capital_of_france")
    mel = fe(x)[..., :-1]
    n = mel.shape[-1]
    trained = fe(np.concatenate([x, np.zeros(30 * 16000, np.float32)]))[..., :3000]
    ours = pad_mel(mel, 3000)
    assert ours.shape == (80, 3000)
    np.testing.assert_allclose(ours[:, : n - 2], trained[:, : n - 2], atol=1e-5)
    np.testing.assert_allclose(ours[:, n + 2 :], trained[:, n + 2 :], atol=1e-5)  # past the seam
    assert pad_mel(mel, 100).shape == (80, 100)  # a longer clip is cut to the window


def test_an_unknown_asr_backend_is_a_config_error_naming_the_key():
    from voicert.config import AsrConfig, ConfigError
    from voicert.speech.asr import BACKENDS, asr_backend

    assert asr_backend(AsrConfig()) is BACKENDS["whisper"]
    with pytest.raises(ConfigError, match=r"asr.backend: 'nemo' is not one of whisper"):
        asr_backend(AsrConfig(backend="nemo"))


def test_zero_asr_threads_is_one_a_core_at_most_four():
    import os

    from voicert.speech.asr import cpu_threads

    assert cpu_threads(3) == 3
    assert cpu_threads(0) == min(4, os.cpu_count() or 1)


class _Tok:
    """A toy tokenizer: ids 0-2 are words, 3 ".", 4 "?", 5 ",", 6 "...", 7 the end token."""

    eot = 7
    pieces = (" I", " need", " eggs", ".", "?", ",", "...", "")

    def encode(self, text):
        return [i for i, p in enumerate(self.pieces) if p == text.strip() or p == text][:1]

    def decode(self, ids):
        return "".join(self.pieces[i] for i in ids)


def test_the_ending_is_read_at_the_step_after_the_last_word_not_at_the_end():
    from voicert.speech.asr import EndingMarks

    marks = EndingMarks(_Tok())
    assert list(marks.stops) == [3, 4] and list(marks.commas) == [5, 6]
    # "I need eggs," then the end token: step 3 (after "eggs") chose ","; step 4 the end token
    after_eggs = np.log([0.01, 0.01, 0.01, 0.2, 0.1, 0.5, 0.1, 0.07])
    assert marks.step_after_last_word([0, 1, 2, 5], 5) == 3
    ending = marks.ending(after_eggs)
    assert ending.stop == pytest.approx(0.3) and ending.comma == pytest.approx(0.6)
    assert marks.step_after_last_word([3], 2) is None  # no word heard
    assert marks.step_after_last_word([0], 1) is None  # no step after it


def test_a_whole_question_ends_in_a_sentence_end(asr):
    x, _ = wav("capital_of_france")
    pad = np.zeros(1600, np.float32)
    whole = asr.transcribe_sync(np.concatenate([x, pad])).ending
    assert whole is not None and whole.stop > 0.8 and whole.comma < 0.05
    assert asr.transcribe_sync(np.zeros(16000, np.float32)).ending is None  # nothing heard


async def test_live_partials_skip_the_ending_and_turn_decodes_keep_it(asr):
    from voicert.core.speech import FINAL, PARTIAL

    x, _ = wav("capital_of_france")
    partial = await asr.submit(x, PARTIAL).future
    final = await asr.submit(x, FINAL).future
    assert partial.text == final.text and partial.text
    assert partial.ending is None and final.ending is not None
