"""A phone-call simulator for each telephony provider the phone door takes (Twilio Media Streams,
Telnyx media streaming, Plivo audio streams): what the provider does on a bidirectional stream, by
its published message formats. It streams a WAV as the caller (G.711 at 8 kHz, 20 ms media messages
at real-time pace), plays the server's media back on a real-time clock, acknowledges each mark
(Twilio and Telnyx echo it, Plivo answers a checkpoint with ``playedStream``) once the audio queued
before it has played, and on a clear drops unplayed audio and acknowledges the pending marks. Between
utterances it keeps streaming silence, as a live call does. At the end it prints the call in words:
what the caller said and what they heard back, each heard on this side of the line by the embedded
Whisper (a carrier's stream carries only audio).

``python -m loadgen.phone --provider telnyx ws://127.0.0.1:8765/telnyx question.wav [more.wav ...]``
(``python -m loadgen.twilio URL WAV...`` is the Twilio one.)
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import itertools
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import soxr
from websockets.asyncio.client import ClientConnection, connect

from loadgen.hear import Ear
from voicert.audio.pcm import encode_audio
from voicert.audio.wav import read_wav
from voicert.client import ClientError, door_url
from voicert.protocol import plivo, telnyx
from voicert.protocol import twilio as tw

FRAME_S = tw.FRAME_BYTES / tw.SAMPLE_RATE  # 20 ms
PROVIDERS = ("twilio", "telnyx", "plivo")
SPEECH_END = "speech end"


class EchoSide:
    """The side of a carrier that opens with ``connected`` and ``start``, echoes each mark once the
    audio before it has played, and ends with ``stop`` (Twilio Media Streams, Telnyx media
    streaming): ``writer`` writes its messages, ``decode`` reads ours as it would, and ``stream``
    (if given) is the stream id each of ours must carry."""

    def __init__(
        self, writer: Any, decode: Callable[[str], dict[str, Any]], stream: str | None = None
    ) -> None:
        self.writer, self.decode, self.stream = writer, decode, stream

    def opening(self) -> list[str]:
        return [self.writer.connected(), self.writer.start()]

    def media(self, payload: bytes, timestamp_ms: int) -> str:
        return self.writer.media(payload, timestamp_ms)

    def played(self, name: str) -> str:
        return self.writer.mark(name)

    def cleared(self) -> list[str]:
        return []

    def closing(self) -> list[str]:
        return [self.writer.stop()]

    def read(self, frame: str) -> tuple[str, Any]:
        msg = self.decode(frame)
        if self.stream is not None:
            assert msg["streamSid"] == self.stream, "reply on the wrong stream"
        return _our(msg["event"], msg.get("media", {}).get("payload"), msg.get("mark"))


def twilio_side(parameters: dict[str, str]) -> EchoSide:
    writer = tw.InboundWriter(
        f"MZ{uuid.uuid4().hex}", f"CA{uuid.uuid4().hex}", custom_parameters=parameters
    )
    return EchoSide(writer, tw.decode_outbound, stream=writer.stream_sid)


def telnyx_side(parameters: dict[str, str]) -> EchoSide:
    writer = telnyx.InboundWriter(str(uuid.uuid4()), f"v3:{uuid.uuid4().hex}", parameters)
    return EchoSide(writer, telnyx.decode_outbound)


class PlivoSide:
    """Plivo's side of an audio-streams call (mu-law 8 kHz). Plivo sends no stop: the call ends
    with the socket."""

    def __init__(self, parameters: dict[str, str]) -> None:
        self.writer = plivo.InboundWriter(str(uuid.uuid4()), str(uuid.uuid4()), parameters)

    def opening(self) -> list[str]:
        return [self.writer.start()]

    def media(self, payload: bytes, timestamp_ms: int) -> str:
        return self.writer.media(payload, timestamp_ms)

    def played(self, name: str) -> str:
        return self.writer.played(name)

    def cleared(self) -> list[str]:
        return [self.writer.cleared()]

    def closing(self) -> list[str]:
        return []

    def read(self, frame: str) -> tuple[str, Any]:
        msg = plivo.decode_outbound(frame)
        if msg["event"] in ("checkpoint", "clearAudio"):
            assert msg["streamId"] == self.writer.stream_id, "reply on the wrong stream"
        kind = {"playAudio": "media", "checkpoint": "mark", "clearAudio": "clear"}[msg["event"]]
        return kind, msg["media"]["payload"] if kind == "media" else msg.get("name")


def _our(kind: str, payload: bytes | None, mark: dict | None) -> tuple[str, Any]:
    """Twilio's and Telnyx's media / mark / clear, as the simulator plays them."""
    if kind == "media":
        return "media", payload
    if kind == "mark":
        return "mark", (mark or {}).get("name")
    return "clear", None


SIDES: dict[str, Callable[[dict[str, str]], Any]] = {
    "twilio": twilio_side,
    "telnyx": telnyx_side,
    "plivo": PlivoSide,
}


@dataclass
class CallResult:
    played: bytearray = field(default_factory=bytearray)  # mu-law the caller heard
    received: bytearray = field(default_factory=bytearray)  # all mu-law the server sent
    media_sizes: list[int] = field(default_factory=list)
    marks_echoed: list[str] = field(default_factory=list)  # played or dropped by a clear, in order
    marks_played: list[str] = field(default_factory=list)  # echoed because their audio played
    clears: int = 0
    played_at_clear: list[int] = field(default_factory=list)  # len(played) when each clear came
    first_audio_after_speech_s: list[float] = field(default_factory=list)  # per utterance
    # per utterance: the span of ``played`` that answered it
    replies: list[tuple[int, int]] = field(default_factory=list)
    close_code: int | None = None
    close_reason: str = ""


class Playback:
    """Twilio's outbound buffer: audio plays at 8000 samples/s; marks sit between audio chunks."""

    def __init__(self) -> None:
        self.queue: list[bytes | str] = []  # audio frames and mark names, in order
        self.clock = time.perf_counter()  # when the audio at the head of the queue will have played

    def push(self, item: bytes | str) -> None:
        if not self.queue:
            self.clock = max(self.clock, time.perf_counter())
        self.queue.append(item)

    def advance(self, now: float, result: CallResult) -> list[str]:
        """Play what is due by ``now``; the marks reached are returned (to echo)."""
        reached = []
        while self.queue:
            head = self.queue[0]
            if isinstance(head, str):
                reached.append(head)
                self.queue.pop(0)
                continue
            end = self.clock + len(head) / tw.SAMPLE_RATE
            if end > now:
                break
            result.played += head
            self.clock = end
            self.queue.pop(0)
        if not self.queue:
            self.clock = now
        return reached

    def clear(self) -> list[str]:
        marks = [m for m in self.queue if isinstance(m, str)]
        self.queue.clear()
        self.clock = time.perf_counter()
        return marks


class PhoneCall:
    """One simulated call against ``url`` through ``provider``'s media stream (async context
    manager; :meth:`speak` each utterance, :meth:`wait_played` for the reply)."""

    def __init__(
        self, url: str, system_prompt: str | None = None, provider: str = "twilio"
    ) -> None:
        self.url = url
        self.side = SIDES[provider]({"system_prompt": system_prompt} if system_prompt else {})
        self.result = CallResult()
        self.playback = Playback()
        self.ws: ClientConnection | None = None
        self.t0 = 0.0
        self._speech_end: float | None = None
        # frames for the line: (mu-law, SPEECH_END at the utterance's end, a future set once sent)
        self._queued: collections.deque[tuple[bytes, str | None, asyncio.Future | None]] = (
            collections.deque()
        )

    async def _send(self, text: str) -> None:
        await self.ws.send(text)

    async def _reader(self) -> None:
        async for frame in self.ws:
            kind, value = self.side.read(frame)
            if kind == "media":
                payload = value
                self.result.media_sizes.append(len(payload))
                self.result.received += payload
                if self._speech_end is not None:
                    self.result.first_audio_after_speech_s.append(
                        time.perf_counter() - self._speech_end
                    )
                    self._speech_end = None
                self.playback.push(payload)
            elif kind == "mark":
                self.playback.push(value)
            else:
                self.result.clears += 1
                self.result.played_at_clear.append(len(self.result.played))
                for name in self.playback.clear():
                    await self._echo(name)
                for text in self.side.cleared():
                    await self._send(text)

    async def _echo(self, name: str) -> None:
        self.result.marks_echoed.append(name)
        await self._send(self.side.played(name))

    async def _player(self) -> None:
        while True:
            for name in self.playback.advance(time.perf_counter(), self.result):
                self.result.marks_played.append(name)
                await self._echo(name)
            await asyncio.sleep(FRAME_S / 2)

    async def speak(self, samples: np.ndarray, rate: int) -> None:
        """Say one utterance (then 1 s of silence, as a caller pausing) on the line, at real-time
        pace; returns once it is sent."""
        x = (
            soxr.resample(samples, rate, tw.SAMPLE_RATE).astype(np.float32)
            if rate != tw.SAMPLE_RATE
            else samples
        )
        data = encode_audio(np.concatenate([x, np.zeros(tw.SAMPLE_RATE, np.float32)]), "mulaw")
        speech_frames = -(-x.size // tw.FRAME_BYTES)
        frames = [data[off : off + tw.FRAME_BYTES] for off in range(0, len(data), tw.FRAME_BYTES)]
        sent = asyncio.get_running_loop().create_future()
        for i, frame in enumerate(frames):
            cue = SPEECH_END if i == speech_frames else None
            self._queued.append((frame, cue, sent if i == len(frames) - 1 else None))
        await sent

    async def _line(self) -> None:
        """The caller's side of the line: a 20 ms frame every 20 ms, what :meth:`speak` queued
        or else silence (a live call never stops sending)."""
        silence = encode_audio(np.zeros(tw.FRAME_BYTES, np.float32), "mulaw")
        start = time.perf_counter()
        for i in itertools.count():
            frame, cue, sent = self._queued.popleft() if self._queued else (silence, None, None)
            if cue == SPEECH_END:
                self._speech_end = time.perf_counter()  # the caller has stopped talking
            ts = int((time.perf_counter() - self.t0) * 1000)
            await self._send(self.side.media(frame, ts))
            if sent is not None and not sent.done():
                sent.set_result(None)
            delay = start + (i + 1) * FRAME_S - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)

    async def wait_played(self, timeout: float = 60.0, since: int = 0) -> None:
        """Until a reply has been sent and played out: a mark played after the first ``since``
        played marks, the last one a reply's end, nothing left to play. Marks a ``clear`` dropped
        do not count (a reply cut off by barge-in was not played out)."""
        deadline = time.perf_counter() + timeout
        marks = self.result.marks_played
        while time.perf_counter() < deadline:
            if len(marks) > since and marks[-1].endswith("-end") and not self.playback.queue:
                return
            await asyncio.sleep(0.05)
        raise TimeoutError("the reply was not played within the timeout")

    async def __aenter__(self) -> PhoneCall:
        self.ws = await connect(self.url, max_size=None, compression=None)
        self.t0 = time.perf_counter()
        for text in self.side.opening():
            await self._send(text)
        self._tasks = [
            asyncio.create_task(self._reader()),
            asyncio.create_task(self._player()),
            asyncio.create_task(self._line()),
        ]
        return self

    async def __aexit__(self, *exc) -> None:
        self._tasks[2].cancel()  # the line goes quiet before the call ends
        try:
            for text in self.side.closing():
                await self._send(text)
            if self.side.closing():
                await asyncio.wait_for(self._tasks[0], 10)
        except Exception:
            pass
        finally:
            for t in self._tasks:
                t.cancel()
            await self.ws.close()
            self.result.close_code = self.ws.close_code
            self.result.close_reason = self.ws.close_reason or ""


async def call(
    url: str, utterances: list[tuple[np.ndarray, int]], provider: str = "twilio"
) -> CallResult:
    """Say each utterance and listen to the whole reply before the next."""
    async with PhoneCall(url, provider=provider) as c:
        for samples, rate in utterances:
            marks, start = len(c.result.marks_played), len(c.result.played)
            await c.speak(samples, rate)
            await c.wait_played(120, since=marks)
            c.result.replies.append((start, len(c.result.played)))
    return c.result


def transcript(result: CallResult, utterances: list[tuple[np.ndarray, int]], ear: Ear) -> list[str]:
    """The call in words, a line a side per utterance: what the caller said and what they heard
    back (both as the line carried them), with the wait for the first reply audio."""
    lines = []
    for i, (samples, rate) in enumerate(utterances):
        lines.append(f"caller {i + 1}: {ear.spoken(samples, rate) or '(no words)'}")
        if i < len(result.replies):
            a, z = result.replies[i]
            heard = ear.line(bytes(result.played[a:z])) or "(no words)"
            wait = result.first_audio_after_speech_s
            after = f" ({wait[i] * 1000:.0f} ms after the caller stopped)" if i < len(wait) else ""
            lines.append(f"agent {i + 1}:  {heard}{after}")
    return lines


def main(argv: list[str] | None = None, provider: str | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    if provider is None:
        ap.add_argument("--provider", choices=PROVIDERS, default="twilio")
    ap.add_argument(
        "url", help="the server: ws://HOST:PORT (the provider's door is added) or the door's URL"
    )
    ap.add_argument("wavs", nargs="+")
    ap.add_argument(
        "--no-transcripts",
        action="store_true",
        help="do not print the call in words (heard on this side by the embedded Whisper)",
    )
    args = ap.parse_args(argv)
    chosen = provider or args.provider
    try:
        url = door_url(args.url, f"/{chosen}")
    except ClientError as exc:
        ap.error(str(exc))
    utterances = [read_wav(w) for w in args.wavs]
    result = asyncio.run(call(url, utterances, chosen))
    print(
        f"played {len(result.played) / tw.SAMPLE_RATE:.2f} s of reply audio in "
        f"{len(result.media_sizes)} media messages; marks {result.marks_echoed}; "
        f"clears {result.clears}"
    )
    problem = None if args.no_transcripts else Ear.problem()
    if args.no_transcripts or problem:
        if problem:
            print(problem)
        for i, s in enumerate(result.first_audio_after_speech_s):
            print(
                f"utterance {i + 1}: first reply audio {s * 1000:.0f} ms after the caller stopped"
            )
        return 0
    for line in transcript(result, utterances, Ear()):
        print(line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
