"""A Twilio Media Streams call simulator: what Twilio does on a ``<Connect><Stream>`` call, by its
published message formats. It streams a WAV as the caller (mu-law 8 kHz, 20 ms ``media`` messages at
real-time pace), plays the server's ``media`` back on a real-time clock, echoes each ``mark`` once the
audio queued before it has played, and on ``clear`` drops unplayed audio and echoes pending marks.

``python -m loadgen.twilio ws://127.0.0.1:8765/twilio question.wav [more.wav ...]``
"""

from __future__ import annotations

import argparse
import asyncio
import time
import uuid
from dataclasses import dataclass, field

import numpy as np
import soxr
from websockets.asyncio.client import ClientConnection, connect

from voicert.audio.pcm import encode_audio
from voicert.audio.wav import read_wav
from voicert.protocol import twilio as tw

FRAME_S = tw.FRAME_BYTES / tw.SAMPLE_RATE  # 20 ms


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


class TwilioCall:
    """One simulated call against ``url``. Use :meth:`run` with the caller's utterances."""

    def __init__(self, url: str, system_prompt: str | None = None) -> None:
        self.url = url
        self.inbound = tw.InboundWriter(
            stream_sid=f"MZ{uuid.uuid4().hex}",
            call_sid=f"CA{uuid.uuid4().hex}",
            custom_parameters={"system_prompt": system_prompt} if system_prompt else {},
        )
        self.result = CallResult()
        self.playback = Playback()
        self.ws: ClientConnection | None = None
        self.t0 = 0.0
        self._speech_end: float | None = None

    async def _send(self, text: str) -> None:
        await self.ws.send(text)

    async def _reader(self) -> None:
        async for frame in self.ws:
            msg = tw.decode_outbound(frame)
            assert msg["streamSid"] == self.inbound.stream_sid, "reply on the wrong stream"
            if msg["event"] == "media":
                payload = msg["media"]["payload"]
                self.result.media_sizes.append(len(payload))
                self.result.received += payload
                if self._speech_end is not None:
                    self.result.first_audio_after_speech_s.append(
                        time.perf_counter() - self._speech_end
                    )
                    self._speech_end = None
                self.playback.push(payload)
            elif msg["event"] == "mark":
                self.playback.push(msg["mark"]["name"])
            elif msg["event"] == "clear":
                self.result.clears += 1
                self.result.played_at_clear.append(len(self.result.played))
                for name in self.playback.clear():
                    await self._echo(name)

    async def _echo(self, name: str) -> None:
        self.result.marks_echoed.append(name)
        await self._send(self.inbound.mark(name))

    async def _player(self) -> None:
        while True:
            for name in self.playback.advance(time.perf_counter(), self.result):
                self.result.marks_played.append(name)
                await self._echo(name)
            await asyncio.sleep(FRAME_S / 2)

    async def speak(self, samples: np.ndarray, rate: int, realtime: bool = True) -> None:
        """Stream one utterance (then 1 s of silence, as a caller pausing) at real-time pace."""
        x = (
            soxr.resample(samples, rate, tw.SAMPLE_RATE).astype(np.float32)
            if rate != tw.SAMPLE_RATE
            else samples
        )
        silence = np.zeros(tw.SAMPLE_RATE, np.float32)
        data = encode_audio(np.concatenate([x, silence]), "mulaw")
        speech_frames = -(-x.size // tw.FRAME_BYTES)
        start = time.perf_counter()
        for i, off in enumerate(range(0, len(data), tw.FRAME_BYTES)):
            frame = data[off : off + tw.FRAME_BYTES]
            if i == speech_frames:
                self._speech_end = time.perf_counter()  # the caller has stopped talking
            ts = int((time.perf_counter() - self.t0) * 1000)
            await self._send(self.inbound.media(frame, ts))
            if realtime:
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

    async def __aenter__(self) -> TwilioCall:
        self.ws = await connect(self.url, max_size=None, compression=None)
        self.t0 = time.perf_counter()
        await self._send(self.inbound.connected())
        await self._send(self.inbound.start())
        self._tasks = [asyncio.create_task(self._reader()), asyncio.create_task(self._player())]
        return self

    async def __aexit__(self, *exc) -> None:
        try:
            await self._send(self.inbound.stop())
            await asyncio.wait_for(self._tasks[0], 10)
        except Exception:
            pass
        finally:
            for t in self._tasks:
                t.cancel()
            await self.ws.close()
            self.result.close_code = self.ws.close_code
            self.result.close_reason = self.ws.close_reason or ""


async def call(url: str, utterances: list[tuple[np.ndarray, int]]) -> CallResult:
    """Say each utterance and listen to the whole reply before the next."""
    async with TwilioCall(url) as c:
        for samples, rate in utterances:
            marks = len(c.result.marks_played)
            await c.speak(samples, rate)
            await c.wait_played(120, since=marks)
    return c.result


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("url")
    ap.add_argument("wavs", nargs="+")
    args = ap.parse_args()
    result = asyncio.run(call(args.url, [read_wav(w) for w in args.wavs]))
    print(
        f"played {len(result.played) / tw.SAMPLE_RATE:.2f} s of reply audio in "
        f"{len(result.media_sizes)} media messages; marks {result.marks_echoed}; "
        f"clears {result.clears}"
    )
    for i, s in enumerate(result.first_audio_after_speech_s):
        print(f"utterance {i + 1}: first reply audio {s * 1000:.0f} ms after the caller stopped")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
