import numpy as np
import pytest

from tests.conftest import wav
from voicert.audio.pcm import StreamResampler
from voicert.speech.vad import FRAME, SileroVad, VadStream


@pytest.fixture(scope="module")
def model():
    return SileroVad()


def test_speech_scores_high_and_silence_low(model):
    x, rate = wav("capital_of_france")
    assert rate == 16000
    audio = np.concatenate([np.zeros(16000, np.float32), x, np.zeros(16000, np.float32)])
    probs = VadStream(model).push(audio)
    assert probs.size == audio.size // FRAME
    assert probs[:25].max() < 0.2  # the leading second of silence
    assert (probs[35:80] > 0.5).mean() > 0.6  # the spoken question
    assert probs[-25:].max() < 0.2


def test_streaming_is_independent_of_chunk_size(model):
    x, _ = wav("capital_of_france")
    whole = VadStream(model).push(x)
    s = VadStream(model)
    parts = np.concatenate([s.push(x[i : i + 320]) for i in range(0, x.size, 320)])
    np.testing.assert_allclose(parts, whole, atol=1e-5)


def test_noise_is_not_speech(model):
    rng = np.random.default_rng(0)
    noise = (0.05 * rng.standard_normal(16000 * 2)).astype(np.float32)
    assert (VadStream(model).push(noise) > 0.5).mean() < 0.05


def test_resampled_48k_speech_is_detected(model):
    import soxr

    x, _ = wav("capital_of_france")
    x48 = soxr.resample(x, 16000, 48000).astype(np.float32)
    y = StreamResampler(48000)(x48)
    assert (VadStream(model).push(y) > 0.5).mean() > 0.4


async def test_batched_scoring_equals_scoring_each_session_alone(model):
    """Sessions with different audio, pushing frames of different sizes in the same loop ticks
    (so jobs of 0, 1 and 2 windows share a batch): every probability equals the one the session
    gets scored alone, exactly."""
    import asyncio

    from voicert.speech.vad import VadBatcher

    rng = np.random.default_rng(1)
    clips = [wav(name)[0] for name in ("capital_of_france", "count_to_five", "tell_me_a_joke")]
    clips.append((0.05 * rng.standard_normal(16000 * 2)).astype(np.float32))
    frames = [320, 512, 800, 1024]  # 20, 32, 50, 64 ms
    alone = [VadStream(model).push(c) for c in clips]
    batcher = VadBatcher(model)
    streams = [VadStream(model) for _ in clips]

    async def feed(i: int) -> np.ndarray:
        clip, step = clips[i], frames[i]
        out = [
            await streams[i].push_batched(clip[j : j + step], batcher)
            for j in range(0, clip.size, step)
        ]
        return np.concatenate(out)

    batched = await asyncio.gather(*(feed(i) for i in range(len(clips))))
    for a, b in zip(alone, batched):
        np.testing.assert_array_equal(a, b)
    assert batcher.rows == sum(a.size for a in alone)
    assert batcher.batches < batcher.rows / 2  # windows of several sessions shared model calls


async def test_a_failing_batch_fails_its_sessions_and_the_next_one_works(model):
    import asyncio

    from voicert.speech.vad import VadBatcher

    batcher = VadBatcher(model)
    bad = VadStream(model)
    bad.state.state = np.zeros((3, 1, 7), np.float32)  # a state of the wrong shape
    with pytest.raises(Exception):  # noqa: B017 - whatever onnxruntime raises for the shape
        await bad.push_batched(np.zeros(FRAME, np.float32), batcher)
    ok = VadStream(model)
    assert (await ok.push_batched(np.zeros(FRAME, np.float32), batcher)).shape == (1,)
    assert asyncio.get_running_loop().is_running()


async def test_windows_that_arrive_while_the_pool_is_busy_go_together_in_the_next_batch(model):
    # One batch in flight (one VAD thread): while it runs, three sessions' windows arrive in
    # three loop iterations; they are scored in one batch as soon as it finishes, exactly as
    # each session alone would get them.
    import asyncio
    import threading
    from concurrent.futures import ThreadPoolExecutor

    from voicert.speech.vad import VadBatcher

    gate = threading.Event()

    class Gated:  # the real model, held back on its first call
        def score(self, windows, states):
            gate.wait(10)
            return model.score(windows, states)

    clips = [
        wav(name)[0][: FRAME * 4]
        for name in ("capital_of_france", "count_to_five", "tell_me_a_joke", "weather_question")
    ]
    alone = [VadStream(model).push(c) for c in clips]
    with ThreadPoolExecutor(1) as pool:
        batcher = VadBatcher(Gated(), pool, in_flight=1)
        streams = [VadStream(model) for _ in clips]
        first = asyncio.ensure_future(streams[0].push_batched(clips[0], batcher))
        await asyncio.sleep(0)
        await asyncio.sleep(0)  # the first batch is in the pool, held
        later = []
        for i in (1, 2, 3):  # each in its own loop iteration
            later.append(asyncio.ensure_future(streams[i].push_batched(clips[i], batcher)))
            await asyncio.sleep(0)
        assert batcher.batches == 0 and not any(f.done() for f in later)
        gate.set()
        got = [await first, *list(await asyncio.gather(*later))]
    for a, b in zip(alone, got):
        np.testing.assert_array_equal(a, b)
    # two batches of four window positions each: the held one, then the three sessions together
    assert batcher.batches == 8 and batcher.rows == 16


def test_finding_the_model_leaves_torch_threads_of_later_threads_alone():
    """silero-vad's import sets torch to one thread; a thread that starts torch work afterwards
    (the engine's) must still get the process's setting."""
    import subprocess
    import sys

    code = (
        "import threading, torch\n"
        "from voicert.speech.vad import SileroVad, silero_model_path\n"
        "torch.set_num_threads(3)\n"
        "silero_model_path(); SileroVad()\n"
        "seen = []\n"
        "t = threading.Thread(target=lambda: seen.append(torch.get_num_threads()))\n"
        "t.start(); t.join()\n"
        "print(seen[0])\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "3"
