"""One simulated caller: a session of several spoken turns at real-time pace over the native
protocol, measuring what the caller experiences beside the server's ``turn.latency`` stages."""

from __future__ import annotations

import asyncio
import bisect
import random
import time
from dataclasses import dataclass, field

import numpy as np
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake

from voicert.audio.pcm import encode_pcm16
from voicert.client import send_silence_until, to_16k
from voicert.protocol import native as p

FRAME_MS = 20
MAX_VALID_SLIP_MS = 10.0  # a level whose frames left later than this at P99 measured the generator


@dataclass
class SlipHistogram:
    """How late each audio frame left against its real-time schedule, in 0.1 ms bins up to 2 s
    (the last bin holds everything later). Mergeable across load-generator processes."""

    counts: list[int] = field(default_factory=lambda: [0] * 20001)

    def add(self, ms: float) -> None:
        self.counts[min(max(int(ms * 10), 0), len(self.counts) - 1)] += 1

    def merge(self, other: SlipHistogram) -> None:
        self.counts = [a + b for a, b in zip(self.counts, other.counts)]

    @property
    def n(self) -> int:
        return sum(self.counts)

    def percentile(self, q: float) -> float:
        """The q-th percentile in ms (the upper edge of its bin); 0 with no samples."""
        total, seen = self.n, 0
        if not total:
            return 0.0
        for i, c in enumerate(self.counts):
            seen += c
            if seen >= total * q / 100:
                return (i + 1) / 10
        return len(self.counts) / 10


def voice_end(samples: np.ndarray, rate: int, threshold: float = 0.5) -> int:
    """The clip's last voiced sample, plus one (in samples at ``rate``): the end of the last
    32 ms window the server's VAD (Silero, as the server runs it) scores at or above
    ``threshold``; 0 when none is voiced. Found once per clip, before the run."""
    from voicert.speech.vad import FRAME, SAMPLE_RATE, SileroVad, VadStream

    x16 = samples if rate == SAMPLE_RATE else to_16k(samples, rate)
    probs = VadStream(SileroVad()).push(x16.astype(np.float32))  # [W]
    voiced = np.flatnonzero(probs >= threshold)
    if not voiced.size:
        return 0
    end16 = (int(voiced[-1]) + 1) * FRAME
    return min(samples.size, end16 * rate // SAMPLE_RATE)


def deciding_frame(sent_end: list[int], audio_ms: int, rate: int) -> int:
    """The index of the frame whose arrival let the server decide at audio position ``audio_ms``
    (the end of a 32 ms VAD window, in the session's audio): the frame holding the window's last
    sample. ``sent_end``: the session's audio position, in samples at ``rate``, at the end of each
    frame sent, in order. By samples, not by counting 20 ms frames: a clip's last frame may be
    short, and every later position moves by what it lacks. len(sent_end) when not yet sent."""
    return bisect.bisect_left(sent_end, audio_ms * rate // 1000)


@dataclass
class TurnSample:
    """One turn as measured. Client times come from the caller's monotonic clock."""

    concurrency: int
    stages: dict[str, float] = field(default_factory=dict)  # server turn.latency
    client_ttft_ms: float | None = None  # last frame of speech sent -> first token received
    # the caller's voice-to-first-token: the frame holding the clip's last voiced sample
    # (:func:`voice_end`) sent -> first token received, by this caller's clock; the server's
    # voice_to_first_token_ms measures the same interval from that frame's arrival
    client_v2ft_ms: float | None = None
    client_done_ms: float | None = None  # last frame of speech sent -> response.done received
    client_ttfa_ms: float | None = None  # last frame of speech sent -> first reply audio (--speak)
    # the server's own origin: the frame its endpoint decision came on (vad.speech_stopped's
    # audio_ms) sent -> first token received; minus the server's ttft_ms: what the wire, the
    # server's intake and this reader added
    client_endpoint_ttft_ms: float | None = None
    client_extra_ms: float | None = None
    endpoint_audio_ms: int | None = None  # vad.speech_stopped's audio position in the session
    finish_reason: str = ""
    transcript: str = ""


@dataclass
class CallerStats:
    turns: list[TurnSample] = field(default_factory=list)
    errors: int = 0  # error events received
    timeouts: int = 0  # turns with no response.done within the turn timeout
    dropped: int = 0  # sessions whose connection failed or closed unexpectedly
    refused: int = 0  # sessions the server refused at the door (503: restarting, at its limit)
    unreachable: int = 0  # sessions that could not connect at all (server down)
    sessions: int = 0
    server: dict[str, float] = field(
        default_factory=dict
    )  # batch sizes, GPU use (loadgen/probe.py)
    slip: SlipHistogram = field(default_factory=SlipHistogram)  # this generator's own lateness

    def merge(self, other: CallerStats) -> None:
        self.turns += other.turns
        self.errors += other.errors
        self.timeouts += other.timeouts
        self.dropped += other.dropped
        self.refused += other.refused
        self.unreachable += other.unreachable
        self.sessions += other.sessions
        self.slip.merge(other.slip)


class Caller:
    def __init__(
        self,
        url: str,
        clips: list[tuple[np.ndarray, int]],
        *,
        turns: int,
        think_s: float,
        turn_timeout_s: float,
        concurrency: int,
        seed: int,
        trailing_silence_s: float = 1.2,
        output_audio: p.OutputAudio | None = None,
        voice_ends: list[int] | None = None,
    ) -> None:
        """``voice_ends``: each clip's :func:`voice_end` (found here when not given)."""
        self.url = url
        self.clips = clips
        self.voice_ends = voice_ends or [voice_end(x, rate) for x, rate in clips]
        self.turns = turns
        self.think_s = think_s
        self.turn_timeout_s = turn_timeout_s
        self.concurrency = concurrency
        self.rng = random.Random(seed)
        self.silence_s = trailing_silence_s
        self.output_audio = output_audio  # ask for the reply's speech too

    async def session(self, stats: CallerStats, stop_at: float, max_turns: int = 0) -> None:
        """One session of up to ``turns`` turns; stops early at ``stop_at`` (monotonic s) or once
        ``stats`` holds ``max_turns`` turns (0: no limit)."""
        stats.sessions += 1
        rate = self.rate = self.clips[0][1]
        self.sent_ns: list[int] = []  # when each frame of this session left, in order
        self.sent_end: list[int] = []  # the session's audio position (samples) at its end
        try:
            ws = await connect(self.url, max_size=None, compression=None, open_timeout=10)
        except InvalidHandshake:
            stats.refused += 1
            await asyncio.sleep(0.5)  # as a client would, before it tries again
            return
        except (TimeoutError, OSError):
            stats.unreachable += 1
            await asyncio.sleep(0.5)
            return
        try:
            async with ws:
                await ws.send(
                    p.encode(p.SessionStart(sample_rate=rate, output_audio=self.output_audio))
                )
                started = p.decode_server(await asyncio.wait_for(ws.recv(), 10))
                if started["type"] != "session.started":
                    stats.errors += 1
                    return
                for _ in range(self.turns):
                    if time.monotonic() >= stop_at or (max_turns and len(stats.turns) >= max_turns):
                        break
                    if not await self._turn(ws, stats, rate):
                        break
                    await asyncio.sleep(self.think_s * self.rng.uniform(0.5, 1.5))
                await ws.send(p.encode(p.SessionEnd()))
        except (TimeoutError, ConnectionClosed, OSError):
            stats.dropped += 1

    async def _turn(self, ws, stats: CallerStats, rate: int) -> bool:
        """Stream one clip, then read until turn.latency. False when the session should end."""
        k = self.rng.randrange(len(self.clips))
        samples, _ = self.clips[k]
        clip_start = self.sent_end[-1] if self.sent_end else 0  # session audio position, samples
        audio = np.concatenate([samples, np.zeros(int(rate * self.silence_s), np.float32)])
        n = rate * FRAME_MS // 1000
        speech_frames = -(-samples.size // n)
        sample = TurnSample(self.concurrency)
        speech_end = 0
        reader = asyncio.create_task(self._read(ws, sample, stats))
        t0 = time.perf_counter()
        try:
            for i in range(0, audio.size, n):
                stats.slip.add((time.perf_counter() - t0) * 1000 - (i // n) * FRAME_MS)
                await ws.send(p.encode(p.Audio(encode_pcm16(audio[i : i + n]))))
                self._sent(min(n, audio.size - i))
                if i // n == speech_frames - 1:
                    speech_end = time.perf_counter_ns()
                delay = t0 + (i // n + 1) * FRAME_MS / 1000 - time.perf_counter()
                if delay > 0:
                    await asyncio.sleep(delay)
            # then silence until the reply is done, as a live line would go on sending
            await asyncio.wait_for(
                send_silence_until(ws, reader, rate, on_frame=lambda: self._sent(n)),
                self.turn_timeout_s,
            )
            reader.result()
        except TimeoutError:
            stats.timeouts += 1
            reader.cancel()
            return False
        except ConnectionClosed:
            reader.cancel()
            raise
        first, done, audio_at = reader.result()
        if first:
            sample.client_ttft_ms = (first - speech_end) / 1e6
            self._same_origin(sample, first)
            if self.voice_ends[k]:
                voiced = bisect.bisect_left(self.sent_end, clip_start + self.voice_ends[k])
                sample.client_v2ft_ms = (first - self.sent_ns[voiced]) / 1e6
        if audio_at:
            sample.client_ttfa_ms = (audio_at - speech_end) / 1e6
        if done:
            sample.client_done_ms = (done - speech_end) / 1e6
        stats.turns.append(sample)
        return True

    def _sent(self, samples: int) -> None:
        """A frame of ``samples`` samples just left."""
        self.sent_ns.append(time.perf_counter_ns())
        self.sent_end.append((self.sent_end[-1] if self.sent_end else 0) + samples)

    def _same_origin(self, sample: TurnSample, first_ns: int) -> None:
        """The client's TTFT from the frame the server decided the endpoint on."""
        if sample.endpoint_audio_ms is None:
            return
        frame = deciding_frame(self.sent_end, sample.endpoint_audio_ms, self.rate)
        if frame < len(self.sent_ns):
            sample.client_endpoint_ttft_ms = (first_ns - self.sent_ns[frame]) / 1e6
            if "ttft_ms" in sample.stages:
                sample.client_extra_ms = sample.client_endpoint_ttft_ms - sample.stages["ttft_ms"]

    async def _read(self, ws, sample: TurnSample, stats: CallerStats) -> tuple[int, int, int]:
        first = done = audio = 0
        while True:
            ev = p.decode_server(await ws.recv())
            kind = ev["type"]
            if kind == "response.token" and not first:
                first = time.perf_counter_ns()
            elif kind == "response.audio" and not audio:
                audio = time.perf_counter_ns()
            elif kind == "vad.speech_stopped" and sample.endpoint_audio_ms is None:
                sample.endpoint_audio_ms = ev["audio_ms"]
            elif kind == "transcript.final":
                sample.transcript = ev["text"]
                if not ev["text"]:
                    return first, done, audio  # nothing recognised: no reply will come
            elif kind == "response.done":
                done = time.perf_counter_ns()
                sample.finish_reason = ev["finish_reason"]
            elif kind == "turn.latency":
                sample.stages = ev["stages"]
                return first, done, audio
            elif kind == "error":
                stats.errors += 1
