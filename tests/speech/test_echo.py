"""The echo guard on real speech: the agent's own reply coming back through a room (delayed,
quieter, with some reverberation) is screened out; a caller's voice, alone or over that echo,
is not."""

from __future__ import annotations

import numpy as np
import pytest
import soxr

from tests.conftest import wav
from voicert.config import TtsConfig
from voicert.speech.echo import EchoGuard, max_ncc

RNG = np.random.default_rng(7)


@pytest.fixture(scope="module")
def reply_24k() -> np.ndarray:
    """A spoken reply as a session sends it: eSpeak NG resampled to the client's 24 kHz."""
    from voicert.speech.tts import EspeakVoice, load_voice

    voice, chunks = EspeakVoice(TtsConfig(voice="en-us")), []
    voice.synthesize(
        "The capital of France is Paris. It is known for the Eiffel Tower and its museums.",
        lambda c: chunks.append(c) or True,
    )
    load_voice(TtsConfig(engine="espeak"))  # the default voice again for later tests
    return soxr.resample(np.concatenate(chunks), voice.sample_rate, 24000).astype(np.float32)


def through_room(
    x16: np.ndarray,
    gain_db: float,
    drr_db: float = 6.0,
    delay_ms: int = 150,
    extra_samples: int = 0,
) -> np.ndarray:
    """``x16`` played and picked up again: ``delay_ms`` (and ``extra_samples`` at 16 kHz) later,
    quieter, a decaying reverberant tail ``drr_db`` below the direct sound, a little noise."""
    tail = RNG.standard_normal(3200) * np.exp(-np.arange(3200) / 800)  # ~50 ms decay
    ir = tail * np.sqrt(1 / (tail**2).sum() / 10 ** (drr_db / 10))
    ir[0] = 1.0
    y = np.convolve(x16, ir)[: x16.size]
    y = y / np.abs(y).max() * np.abs(x16).max() * 10 ** (gain_db / 20)
    y = np.concatenate([np.zeros(16 * delay_ms + extra_samples), y])
    return (y + 0.002 * RNG.standard_normal(y.size)).astype(np.float32)


MS = 1_000_000


def screened(
    guard: EchoGuard, mic16: np.ndarray, t0_ms: int = 0, runs: list[int] | None = None
) -> tuple[int, int]:
    """Stream ``mic16`` in 20 ms frames from ``t0_ms`` on a fake clock, as if every window were
    speech (prob 0.9): (windows screened out, windows). ``runs`` gets the lengths of the runs of
    windows let through."""
    out = total = run = 0
    for k, i in enumerate(range(0, mic16.size, 320)):
        n = (i + 320) // 512 - i // 512
        probs = guard.screen(mic16[i : i + 320], np.full(n, 0.9, np.float32), (t0_ms + 20 * k) * MS)
        out += int(np.count_nonzero(probs == 0))
        total += n
        for prob in probs:
            run = run + 1 if prob > 0 else 0
            if runs is not None and run:
                runs.append(run)
    return out, total


def guard_after(reply_24k: np.ndarray) -> EchoGuard:
    guard = EchoGuard()
    for i in range(0, reply_24k.size, 2400):  # all sent at once, long before it has played
        guard.reference(reply_24k[i : i + 2400], 24000, 0)
    return guard


@pytest.mark.parametrize("gain_db", [-6, -9, -12])
def test_the_replys_own_echo_is_screened_out(reply_24k, gain_db):
    echo = through_room(soxr.resample(reply_24k, 24000, 16000), gain_db)
    out, total = screened(guard_after(reply_24k), echo)
    voiced = total - 10  # the first 256 ms fill the block, the delay and the tail are silence
    assert out >= 0.8 * voiced, (out, total)


def test_an_echo_an_odd_number_of_samples_late_correlates_as_well_as_an_even_one(reply_24k):
    """An echo's delay is any number of 16 kHz samples; at 8 kHz an odd one falls between two of
    the reference's samples. Measured both ways, the echo's correlation does not depend on it
    (with only the even samples an odd delay cost it about a third: self-interruptions)."""
    reply16 = soxr.resample(reply_24k, 24000, 16000).astype(np.float32)
    lows = []
    for extra in (0, 1):
        guard, scores = guard_after(reply_24k), []
        mic = through_room(reply16, -9, extra_samples=extra)
        for k, i in enumerate(range(0, mic.size, 320)):
            n = (i + 320) // 512 - i // 512
            guard.screen(mic[i : i + 320], np.full(n, 0.9, np.float32), 20 * k * MS)
            if guard.verdict is not None and n:
                scores.append(guard.score)
        lows.append(np.percentile(scores, 10))
    print("10th percentile correlation, even and odd delay:", lows)
    assert min(lows) >= 0.7 and abs(lows[0] - lows[1]) < 0.1, lows


def test_a_callers_own_voice_is_not_screened_alone_or_over_the_echo(reply_24k):
    caller, rate = wav("capital_of_france")  # another voice saying other words
    caller = soxr.resample(caller, rate, 16000).astype(np.float32) if rate != 16000 else caller
    out, total = screened(guard_after(reply_24k), caller)
    assert out <= 0.1 * total, (out, total)
    echo = through_room(soxr.resample(reply_24k, 24000, 16000), -6)[: caller.size]
    both = caller[: echo.size] + echo
    runs: list[int] = []
    out, total = screened(guard_after(reply_24k), both, runs=runs)
    # where the echo outweighs the caller (between words) it may be screened; the caller's
    # speech still goes through long enough to start a turn (vad.min_speech_ms: 3 windows)
    assert max(runs) >= 8 and out <= 0.5 * total, (out, total, max(runs))


def test_no_reference_or_an_old_one_screens_nothing_and_silence_is_left_alone(reply_24k):
    echo = through_room(soxr.resample(reply_24k, 24000, 16000), -9)
    assert screened(EchoGuard(), echo)[0] == 0  # nothing sent: nothing to be an echo of
    late = 8000  # ms: the reply (~4.6 s) has played and 2 s more have passed
    assert screened(guard_after(reply_24k), echo, t0_ms=late)[0] == 0
    guard = guard_after(reply_24k)
    probs = np.array([0.1, 0.05], np.float32)  # silence: not even measured
    assert guard.screen(echo[:1024], probs, 0) is probs


def test_max_ncc_finds_a_scaled_copy_at_any_delay_and_not_noise():
    ref = RNG.standard_normal(8000).astype(np.float32)
    assert max_ncc(0.1 * ref[3000:5048], ref) == pytest.approx(1.0, abs=1e-4)
    assert max_ncc(RNG.standard_normal(2048).astype(np.float32), ref) < 0.15
    assert max_ncc(np.zeros(2048, np.float32), ref) == 0.0


def test_speech_held_while_reply_audio_plays_comes_back_whole_and_in_order(reply_24k):
    caller, rate = wav("capital_of_france")
    caller = soxr.resample(caller, rate, 16000).astype(np.float32) if rate != 16000 else caller
    mic = np.concatenate((caller, np.zeros(8000, np.float32)))
    guard, given, back, held_most = guard_after(reply_24k), [], [], 0
    for k, i in enumerate(range(0, mic.size, 320)):
        n = (i + 320) // 512 - i // 512
        probs = (
            np.linspace(0.4, 0.9, n).astype(np.float32)
            if np.abs(mic[i : i + 320]).max() > 0.01
            else np.zeros(n, np.float32)
        )
        given.extend(probs)
        back.extend(guard.screen(mic[i : i + 320], probs, 20 * k * MS))
        held_most = max(held_most, len(given) - len(back))
    assert back == given  # the caller's own voice: every window, unchanged, in order
    assert (
        0 < held_most <= 9
    )  # held for at most the 256 ms block (8 windows, and the one ending it)
