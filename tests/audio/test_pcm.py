import numpy as np
import pytest

from voicert.audio.buffer import AudioBuffer
from voicert.audio.pcm import (
    AudioFormatError,
    StreamResampler,
    decode_pcm,
    encode_audio,
    encode_pcm16,
    lin2alaw,
    lin2ulaw,
)


def test_pcm16_round_trip():
    x = np.linspace(-0.9, 0.9, 101, dtype=np.float32)
    y = decode_pcm(encode_pcm16(x), "pcm16")
    assert np.abs(x - y).max() < 1e-4


def test_f32_decodes_and_clips():
    x = np.array([0.5, -2.0], np.float32)
    assert decode_pcm(x.tobytes(), "f32").tolist() == [0.5, -1.0]


@pytest.mark.parametrize(
    "data, enc, msg",
    [
        (b"\x00\x01\x02", "pcm16", "even byte count"),
        (b"\x00" * 6, "f32", "multiple of 4"),
        (np.array([np.nan], np.float32).tobytes(), "f32", "NaN"),
        (np.array([np.inf], np.float32).tobytes(), "f32", "NaN or infinite"),
    ],
)
def test_bad_audio_raises(data, enc, msg):
    with pytest.raises(AudioFormatError, match=msg):
        decode_pcm(data, enc)


@pytest.mark.parametrize("rate", [8000, 24000, 44100, 48000])
def test_stream_resampler_keeps_duration_and_pitch(rate):
    t = np.arange(rate * 2) / rate
    x = np.sin(2 * np.pi * 440 * t).astype(np.float32)
    rs = StreamResampler(rate)
    y = np.concatenate([rs(x[i : i + rate // 50]) for i in range(0, x.size, rate // 50)])
    assert abs(y.size - 32000) < 480  # soxr HQ holds back < 30 ms (its filter delay)
    spectrum = np.abs(np.fft.rfft(y[1000:17000]))  # 16000 samples: 1 Hz per bin
    assert abs(int(np.argmax(spectrum)) - 440) <= 2


def test_buffer_slices_by_absolute_position():
    b = AudioBuffer()
    b.append(np.arange(10, dtype=np.float32))
    b.trim_before(4)
    b.append(np.arange(10, 15, dtype=np.float32))
    assert b.base == 4 and b.end == 15
    assert b.slice(2, 7).tolist() == [4, 5, 6]
    assert b.slice(13, 99).tolist() == [13, 14]


@pytest.mark.parametrize("encoding", ["mulaw", "alaw"])
def test_g711_decoding_matches_the_reference(encoding):
    audioop = pytest.importorskip("audioop")  # the stdlib codec (Python < 3.13) as the reference
    data = bytes(range(256))
    ref = (
        np.frombuffer(
            (audioop.ulaw2lin if encoding == "mulaw" else audioop.alaw2lin)(data, 2), "<i2"
        ).astype(np.float32)
        / 32768.0
    )
    np.testing.assert_array_equal(decode_pcm(data, encoding), ref)


def test_g711_round_trip_keeps_speech_recognisable_level():
    audioop = pytest.importorskip("audioop")
    x = (0.5 * np.sin(np.linspace(0, 200, 8000))).astype(np.float32)
    y = decode_pcm(audioop.lin2ulaw(encode_pcm16(x), 2), "mulaw")
    assert np.abs(x - y).max() < 0.02


def test_g711_encoders_bit_exact_against_the_reference_codec():
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        audioop = pytest.importorskip("audioop")  # the stdlib reference codec (Python <= 3.12)
    x = np.arange(-32768, 32768, dtype=np.int16)  # every 16-bit value
    raw = x.astype("<i2").tobytes()
    assert lin2ulaw(x).tobytes() == audioop.lin2ulaw(raw, 2)
    assert lin2alaw(x).tobytes() == audioop.lin2alaw(raw, 2)


@pytest.mark.parametrize("encoding", ["mulaw", "alaw"])
def test_g711_every_code_survives_decode_then_encode(encoding):
    codes = np.arange(256, dtype=np.uint8)
    if encoding == "mulaw":
        codes = codes[codes != 0x7F]  # mu-law has two zeros (+0 0xFF, -0 0x7F); +0 wins
    x = decode_pcm(codes.tobytes(), encoding)
    assert (
        np.frombuffer(encode_audio(x * 32767 / 32768, encoding), np.uint8).tolist()
        == codes.tolist()
    )


def test_encode_audio_pcm16_and_unknown():
    assert decode_pcm(encode_audio(np.array([0.5, -0.5], np.float32), "pcm16"), "pcm16")[
        0
    ] == pytest.approx(0.5, abs=1e-4)
    with pytest.raises(AudioFormatError):
        encode_audio(np.zeros(2, np.float32), "opus")
