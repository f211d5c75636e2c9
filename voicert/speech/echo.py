"""Echo guard: the agent's own voice coming back through the caller's microphone (a speakerphone,
a phone line's echo) must not count as the caller speaking, or the agent interrupts itself.

The session knows exactly what it sent: each reply's audio, as written to the socket. An
:class:`EchoGuard` keeps the last ``memory_s`` of it (the *reference*) and, for each VAD window
of the input that sounds like speech, measures the largest normalised cross-correlation between
the last ``block_ms`` of input and any stretch of the reference (every delay at once, by FFT, so
the client's playback buffer and the echo path's delay need not be known). A block the reference
explains (correlation at or above ``threshold``) is the agent's own voice: the session scores
that window as silence. The caller's own voice does not correlate with the reply, so speech over
an echo lowers the figure (to about the echo's share of the block's amplitude) and counts.

All at 8 kHz, pre-emphasised (speech below 4 kHz is what correlates). Pure numpy on the caller's
thread, one FFT correlation (~1-2 ms) per chunk of input with speech in it while reply audio
played in the last ``memory_s``; nothing otherwise. What it cannot tell: an echo so reverberant
that it no longer resembles what was sent (direct-to-reverberant ratio below ~0 dB), which then
counts as the caller, as it did without the guard. The price: while reply audio is playing, the
start of the caller's speech reaches the VAD up to ``block_ms`` late (it is held until it can be
judged).
"""

from __future__ import annotations

import logging

import numpy as np

log = logging.getLogger(__name__)

IN_RATE = 16000  # the session's input rate (the VAD's)
RATE = 8000  # where correlation is measured
WINDOW = 512  # input samples per VAD window (speech/vad.py FRAME)
SLACK = RATE // 5  # 200 ms: reply audio counted as playing early (clients' clocks are not ours)
ADOPT = 4  # chunks of input (~80 ms) in a row that change a run's verdict


EMPHASIS = 0.97  # pre-emphasis: flattens speech's spectrum, so that two unrelated voices'
# strong low harmonics do not correlate by chance (unrelated speech: median 0.41 -> 0.34)


def _halfband(taps: int = 31) -> np.ndarray:
    """A windowed-sinc low-pass at 3.6 kHz for 16 kHz audio (before keeping every other
    sample): [taps]."""
    n = np.arange(taps) - (taps - 1) / 2
    h = np.sinc(2 * 3600 / IN_RATE * n) * np.hamming(taps)
    return (h / h.sum()).astype(np.float32)


LOWPASS = _halfband()


class To8k:
    """To 8 kHz, pre-emphasised, with ~1 ms of delay: 16 kHz audio is low-passed (carrying the
    filter's history from chunk to chunk) and every other sample kept; other rates go to 16 kHz
    first, each chunk on its own. (soxr's stream resampler holds input back in ~100 ms blocks,
    so the newest input would be missing from the block compared.)"""

    def __init__(self, rate: int, phase: int = 0) -> None:
        """``phase`` 1 keeps the other half of the samples: the same audio half an 8 kHz sample
        (62.5 us) later."""
        self.rate = rate
        self.history = np.zeros(LOWPASS.size - 1, np.float32)  # the filter's last inputs
        self.phase = phase  # 0: the next filtered sample is kept; 1: skipped
        self.last = 0.0  # the previous output's last sample, for the pre-emphasis

    def __call__(self, x: np.ndarray) -> np.ndarray:
        """float32 [N] at ``rate`` -> float32 [M] at 8 kHz, pre-emphasised."""
        x = x.astype(np.float32, copy=False)
        if self.rate != IN_RATE and x.size:
            import soxr

            x = soxr.resample(x, self.rate, IN_RATE).astype(np.float32)
        if not x.size:
            return x
        full = np.concatenate((self.history, x))
        self.history = full[-(LOWPASS.size - 1) :]
        filtered = np.convolve(full, LOWPASS, mode="valid")  # [N]
        y = filtered[self.phase :: 2]
        self.phase = (self.phase + x.size) % 2
        if not y.size:
            return y
        out = np.empty_like(y)
        out[0] = y[0] - EMPHASIS * self.last
        out[1:] = y[1:] - EMPHASIS * y[:-1]
        self.last = float(y[-1])
        return out


def ncc_curves(blocks: list[np.ndarray], reference: np.ndarray) -> list[np.ndarray]:
    """Normalised cross-correlation of each block [B] (all of one size) against each B-long
    stretch of ``reference`` [R] (R >= B), by where the stretch starts: [R - B + 1] each (empty
    when it cannot be measured). The reference's spectrum and stretch energies are computed once
    for all the blocks."""
    b, r = blocks[0].size, reference.size
    if b == 0 or r < b:
        return [np.zeros(0) for _ in blocks]
    n = 1 << int(np.ceil(np.log2(r + b)))  # no wrap-around
    ref_spectrum = np.fft.rfft(reference, n)
    energy = np.cumsum(np.concatenate(([0.0], reference.astype(np.float64) ** 2)))  # [R + 1]
    stretch = np.sqrt(np.maximum(energy[b:] - energy[:-b], 1e-12))  # [R - B + 1]
    curves = []
    for block in blocks:
        norm_b = float(np.sqrt(np.dot(block, block)))
        if norm_b == 0.0:
            curves.append(np.zeros(0))
            continue
        corr = np.fft.irfft(ref_spectrum * np.conj(np.fft.rfft(block, n)), n)[: r - b + 1]
        curves.append(corr / (stretch * norm_b))
    return curves


def max_ncc(block: np.ndarray, reference: np.ndarray) -> float:
    """Largest normalised cross-correlation of ``block`` [B] against every B-long stretch of
    ``reference`` [R] (R >= B): 1.0 when some stretch is ``block`` scaled, ~0 for unrelated
    signals."""
    curve = ncc_curves([block], reference)[0]
    return float(np.max(curve)) if curve.size else 0.0


def _ms(t_ns: int) -> int:
    """A clock reading in ms, as logged (the last 100 s of it)."""
    return t_ns // 1_000_000 % 100_000


class EchoGuard:
    """One session's echo screen. :meth:`reference` with each chunk of reply audio as it is
    sent; :meth:`screen` with each chunk of input and the VAD probabilities of the windows it
    completed. Single-threaded (the session's event loop).

    Reply audio may be sent ahead of its playing (a reply is made faster than it is spoken), so
    the reference is kept on a *playback timeline*: a chunk plays when it arrives, or when the
    one before it has finished playing, whichever is later (a client's playout buffer: the rule
    of ``audio/playout.Playout``, here sample by sample). A block of input is compared with
    what played in the ``memory_s`` before it."""

    def __init__(
        self,
        threshold: float = 0.6,
        memory_s: float = 2.0,
        block_ms: int = 256,
        speech_prob: float = 0.3,
    ) -> None:
        self.threshold = threshold
        self.memory = int(memory_s * RATE)
        self.block = block_ms * RATE // 1000
        self.speech_prob = speech_prob  # windows below this are silence anyway: not measured
        self.timeline = np.zeros(0, np.float32)  # reply audio by playback time, 8 kHz
        self.t0_ns = 0  # the playback time of timeline[0]
        # [<= block] the latest input at 8 kHz, twice: from the even and from the odd samples at
        # 16 kHz. An echo's delay is any number of 16 kHz samples; against the reference's own
        # 8 kHz grid one of the two is aligned, the other half a sample off (which costs
        # pre-emphasised speech, mostly high frequencies, a third of its correlation)
        self.inp = (np.zeros(0, np.float32), np.zeros(0, np.float32))
        self.min_run = 96 * RATE // 1000  # shorter speech is not judged (nor can it start a turn)
        self.held: list[np.ndarray] = []  # probabilities of a run of speech not yet judged
        self.run = 0  # 8 kHz samples of that run so far
        self.verdict: bool | None = None  # the judgement of the run in progress, once made
        self.low = 0  # chunks in a row, within a run, that disagreed with its verdict
        self.score = 0.0  # the last correlation measured
        self.lag_ms = -1  # and how far back in what had played its best match lay
        self._in8k = (To8k(IN_RATE), To8k(IN_RATE, phase=1))
        self._ref8k: To8k | None = None

    def _index(self, t_ns: int) -> int:
        """The timeline sample that plays at ``t_ns``."""
        return (t_ns - self.t0_ns) * RATE // 1_000_000_000

    def reference(self, audio: np.ndarray, rate: int, now_ns: int) -> None:
        """Reply audio sent at ``now_ns`` (float32 [N] at ``rate``: one rate per session)."""
        if self._ref8k is None or self._ref8k.rate != rate:
            self._ref8k = To8k(rate)
        x = self._ref8k(audio)
        start = self._index(now_ns)
        if start > self.timeline.size:  # nothing was playing: it plays now, after a silence
            if start - self.timeline.size > self.memory:  # long since: start afresh
                self.timeline, self.t0_ns, start = np.zeros(0, np.float32), now_ns, 0
            gap = np.zeros(start - self.timeline.size, np.float32)
            self.timeline = np.concatenate((self.timeline, gap))
        log.debug(
            "echo: %d ms of reply audio sent at %d ms, plays from %d ms",
            x.size // 8,
            _ms(now_ns),
            _ms(self.t0_ns + self.timeline.size * 1_000_000_000 // RATE),
        )
        self.timeline = np.concatenate((self.timeline, x))
        keep = self._index(now_ns) - self.memory  # what played long enough ago can go
        if keep > 0:
            self.timeline = self.timeline[keep:]
            self.t0_ns += keep * 1_000_000_000 // RATE

    def screen(self, x16: np.ndarray, probs: np.ndarray, now_ns: int) -> np.ndarray:
        """``x16``: the input just pushed to the VAD (float32 [N], 16 kHz), received at
        ``now_ns``; ``probs``: the speech probabilities [W] of the windows it completed.

        Returns the probabilities to go on with, in order: those the reference explains set to 0.
        While reply audio is playing, speech that begins is *held* (an empty array returned)
        until ``block_ms`` of it can be compared (or it ends), then released as it was, or
        zeroed: the first windows of an echo are mostly the silence before it and cannot be
        judged alone. So the caller sees the same windows, in order, at most ``block_ms``
        later."""
        x8, odd = (to8k(x16) for to8k in self._in8k)
        self.inp = (
            np.concatenate((self.inp[0], x8))[-self.block :],
            np.concatenate((self.inp[1], odd))[-self.block :],
        )
        if self.held:
            self.run += x8.size  # a run being held goes on until a window says otherwise
        if not probs.size:  # no window completed: nothing to decide
            return probs
        played = self._played(now_ns)
        voiced = float(probs.max()) >= self.speech_prob
        if played is None:  # nothing played lately: nothing to be an echo of
            return self._release(probs)
        if self.verdict is not None:  # within a run already judged
            if not voiced:
                self.verdict = None  # the run is over
                return probs
            return self._apply(probs, self._still_echo(self._is_echo(self.inp, played), now_ns))
        if not self.held and not voiced:
            return probs
        if not self.held:
            self.run = x8.size
        self.held.append(probs)
        if voiced and self.run < self.block:
            return np.zeros(0, probs.dtype)  # not enough of it to judge yet
        size = min(max(self.run, 1), self.block)
        span = (self.inp[0][-size:], self.inp[1][-size:])
        echo = self.run >= self.min_run and self._is_echo(span, played)
        log.debug(
            "echo: at %d ms, run of %d ms judged %s (correlation %.2f at %d ms back, %d ms played)",
            _ms(now_ns),
            self.run // 8,
            "an echo" if echo else "the caller",
            self.score,
            self.lag_ms,
            played.size // 8,
        )
        held = np.concatenate(self.held)
        self.held, self.run, self.low = [], 0, 0
        if voiced:
            self.verdict = echo
        return self._apply(held, echo)

    def _played(self, now_ns: int) -> np.ndarray | None:
        """What played in the ``memory_s`` before ``now_ns``, and up to ``SLACK`` after it (the
        client's clock and ours differ by network jitter), then a block of silence, so that a
        block whose echo runs past what we think has played is still compared in part (None
        when nothing played)."""
        now = self._index(now_ns) + SLACK
        played = self.timeline[max(0, now - self.memory) : max(0, min(now, self.timeline.size))]
        if not played.size or not np.any(played):
            return None
        return np.concatenate((played, np.zeros(self.block // 2, np.float32)))

    def _is_echo(self, span: tuple[np.ndarray, np.ndarray], played: np.ndarray) -> bool:
        """Whether either decimation of the input ``span`` correlates with what ``played`` at or
        above the threshold."""
        size = span[0].size
        if played.size < size:  # playing began within the span: silence before it
            played = np.concatenate((np.zeros(size - played.size, np.float32), played))
        self.score, self.lag_ms = 0.0, -1
        for curve in ncc_curves(list(span), played):
            best = int(np.argmax(curve)) if curve.size else -1
            if best >= 0 and float(curve[best]) > self.score:
                self.score = float(curve[best])
                # how long before the block's end its match ended playing (for the log)
                self.lag_ms = (played.size - best - size) // 8
        return self.score >= self.threshold

    def _still_echo(self, echo_now: bool, now_ns: int) -> bool:
        """Within a run the verdict changes only after ``ADOPT`` chunks in a row say otherwise:
        an echo stays one through a dip of its correlation (a quiet or noisy stretch), and the
        caller stays the caller through a block of their speech that happens to resemble some
        stretch of the reply (unrelated speech reaches the threshold in a few blocks in a
        hundred)."""
        self.low = 0 if echo_now == self.verdict else self.low + 1
        if self.low < ADOPT:
            return bool(self.verdict)
        self.low = 0
        if echo_now != self.verdict:
            log.debug(
                "echo: at %d ms, within a run, now %s (correlation %.2f at %d ms back)",
                _ms(now_ns),
                "an echo" if echo_now else "the caller",
                self.score,
                self.lag_ms,
            )
        self.verdict = echo_now
        return echo_now

    def _apply(self, probs: np.ndarray, echo: bool) -> np.ndarray:
        if not echo:
            return probs
        return np.where(probs >= self.speech_prob, 0.0, probs).astype(probs.dtype)

    def _release(self, probs: np.ndarray) -> np.ndarray:
        """Held windows (if any) and these, as they were."""
        self.verdict = None
        if not self.held:
            return probs
        out = np.concatenate((*self.held, probs))
        self.held, self.run = [], 0
        return out
