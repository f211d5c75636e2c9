"""WAV files as recorders and editors write them: PCM of 8-32 bits, IEEE float, G.711, plain or
WAVE_FORMAT_EXTENSIBLE, read to the same float samples; other encodings refused by name."""

import numpy as np
import pytest

from voicert.audio.wav import read_wav

SIGNAL = np.array([0.0, 0.5, -0.5, 0.25, -1.0, 0.999], np.float32)


def _wav(path, tag: int, bits: int, payload: bytes, channels: int = 1, extensible: bool = False):
    rate = 16000
    block = channels * bits // 8
    fmt = (
        (0xFFFE if extensible else tag).to_bytes(2, "little")
        + channels.to_bytes(2, "little")
        + rate.to_bytes(4, "little")
        + (rate * block).to_bytes(4, "little")
        + block.to_bytes(2, "little")
        + bits.to_bytes(2, "little")
    )
    if extensible:  # cbSize, valid bits, channel mask, sub-format GUID (tag first)
        guid = tag.to_bytes(2, "little") + bytes.fromhex("000000001000800000aa00389b71")
        fmt += (22).to_bytes(2, "little") + bits.to_bytes(2, "little") + bytes(4) + guid
    body = b"WAVE" + b"fmt " + len(fmt).to_bytes(4, "little") + fmt
    body += b"data" + len(payload).to_bytes(4, "little") + payload
    path.write_bytes(b"RIFF" + len(body).to_bytes(4, "little") + body)
    return path


def _pcm24(x: np.ndarray) -> bytes:
    v = np.round(x * (1 << 23)).clip(-(1 << 23), (1 << 23) - 1).astype(np.int32)
    return b"".join(int(s).to_bytes(3, "little", signed=True) for s in v)


@pytest.mark.parametrize("extensible", [False, True])
@pytest.mark.parametrize(
    "tag, bits, encode, tol",
    [
        (1, 16, lambda x: (x * 32767).astype("<i2").tobytes(), 1e-4),
        (1, 24, _pcm24, 1e-6),
        (
            1,
            32,
            lambda x: (
                (x.astype(np.float64) * 2**31).clip(-(2**31), 2**31 - 1).astype("<i4").tobytes()
            ),
            1e-6,
        ),
        (3, 32, lambda x: x.astype("<f4").tobytes(), 0),
        (3, 64, lambda x: x.astype("<f8").tobytes(), 0),
    ],
)
def test_every_common_encoding_reads_to_the_same_samples(
    tmp_path, tag, bits, encode, tol, extensible
):
    path = _wav(tmp_path / "x.wav", tag, bits, encode(SIGNAL), extensible=extensible)
    x, rate = read_wav(path)
    assert rate == 16000
    np.testing.assert_allclose(x, SIGNAL, atol=tol + 1e-7)


def test_stereo_24_bit_is_averaged_to_mono(tmp_path):
    both = np.stack([SIGNAL, -SIGNAL * 0.5], 1).reshape(-1)
    x, _ = read_wav(_wav(tmp_path / "s.wav", 1, 24, _pcm24(both), channels=2))
    np.testing.assert_allclose(x, SIGNAL * 0.25, atol=1e-6)


def test_an_encoding_it_cannot_read_is_refused_naming_it(tmp_path):
    path = _wav(tmp_path / "adpcm.wav", 2, 4, bytes(16))
    with pytest.raises(ValueError, match="format tag 2"):
        read_wav(path)
    (tmp_path / "no.wav").write_bytes(b"ID3\x03 not audio")
    with pytest.raises(ValueError, match="not a WAV"):
        read_wav(tmp_path / "no.wav")
