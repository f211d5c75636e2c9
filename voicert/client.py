"""``voicert client FILE.wav``: stream a WAV at real-time pace over the native protocol and print the
transcript, the reply as it streams, and each turn's latency table. Also a small library for tests
and the load generator: :func:`stream_wav` returns what the server sent."""

from __future__ import annotations

import asyncio
import base64
import sys
import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
from websockets.asyncio.client import connect

from voicert.audio.pcm import encode_pcm16
from voicert.audio.wav import read_wav
from voicert.config import SUPPORTED_SAMPLE_RATES
from voicert.protocol import native as p
from voicert.telemetry.latency import format_table

FRAME_MS = 20


@dataclass
class TurnResult:
    turn_id: int
    transcript: str = ""
    reply: str = ""
    done: dict | None = None
    latency: dict[str, float] = field(default_factory=dict)
    audio: bytearray = field(default_factory=bytearray)  # the spoken reply, in output_audio format
    audio_pieces: list[str] = field(default_factory=list)  # the text pieces it was spoken in


@dataclass
class ClientResult:
    session_id: str = ""
    turns: list[TurnResult] = field(default_factory=list)
    events: list[dict] = field(default_factory=list)
    errors: list[dict] = field(default_factory=list)


def frames_for(x: np.ndarray, rate: int, frame_ms: int = FRAME_MS) -> list[bytes]:
    n = rate * frame_ms // 1000
    return [encode_pcm16(x[i:i + n]) for i in range(0, x.size, n)]


async def stream_audio(url: str, turns: list[tuple[np.ndarray, int]], *, realtime: bool = True,
                       trailing_silence_s: float = 1.0, turn_timeout_s: float = 120.0,
                       system_prompt: str | None = None, binary: bool = True,
                       output_audio: p.OutputAudio | None = None,
                       on_event: Callable[[dict], None] | None = None,
                       until_answered: bool = True) -> ClientResult:
    """Open one session; for each (samples, rate) in ``turns`` stream the audio plus trailing
    silence in 20 ms frames, then wait for that turn's ``turn.latency`` before the next, sending
    silence meanwhile as a live microphone would (``until_answered``; False: nothing more, so that
    the server receives exactly the same audio on every run)."""
    rate = turns[0][1]
    result = ClientResult()
    async with connect(url, max_size=None, compression=None) as ws:
        await ws.send(p.encode(p.SessionStart(sample_rate=rate, system_prompt=system_prompt,
                                              output_audio=output_audio), binary))
        msg = p.decode_server(await ws.recv())
        if msg["type"] != "session.started":
            raise RuntimeError(f"session refused: {msg}")
        result.session_id = msg["session_id"]
        turn_done = asyncio.Event()
        current: dict[int, TurnResult] = {}

        async def reader() -> None:
            async for frame in ws:
                ev = p.decode_server(frame)
                result.events.append(ev)
                if on_event:
                    on_event(ev)
                kind = ev["type"]
                tid = None if kind.startswith("vad.") else ev.get("turn_id")
                if tid is not None and tid not in current:
                    current[tid] = TurnResult(tid)
                    result.turns.append(current[tid])
                turn = current.get(tid)
                if kind == "transcript.final":
                    turn.transcript = ev["text"]
                    if not ev["text"]:
                        turn_done.set()
                elif kind == "response.token":
                    turn.reply += ev["text"]
                elif kind == "response.audio":
                    audio = ev["audio"]
                    turn.audio += audio if isinstance(audio, bytes) else base64.b64decode(audio)
                    if ev["text"]:
                        turn.audio_pieces.append(ev["text"])
                elif kind == "response.done":
                    turn.done = ev
                elif kind == "turn.latency":
                    turn.latency = ev["stages"]
                    turn_done.set()
                elif kind == "error":
                    result.errors.append(ev)

        read_task = asyncio.create_task(reader())
        silence = np.zeros(int(rate * trailing_silence_s), np.float32)
        try:
            for samples, _ in turns:
                turn_done.clear()
                t0 = time.perf_counter()
                frames = frames_for(np.concatenate([samples, silence]), rate)
                for i, frame in enumerate(frames):
                    await ws.send(p.encode(p.Audio(frame), binary))
                    if realtime:
                        delay = t0 + (i + 1) * FRAME_MS / 1000 - time.perf_counter()
                        if delay > 0:
                            await asyncio.sleep(delay)
                answered = asyncio.ensure_future(turn_done.wait())
                try:
                    waiting = (send_silence_until(ws, answered, rate, binary) if until_answered
                               else answered)
                    await asyncio.wait_for(waiting, turn_timeout_s)
                finally:
                    answered.cancel()
            await ws.send(p.encode(p.SessionEnd(), binary))
            await asyncio.wait_for(read_task, 30)
        finally:
            read_task.cancel()
    return result


async def send_silence_until(ws, done: asyncio.Future, rate: int, binary: bool = True) -> None:
    """Go on sending silence at real-time pace until ``done`` (a future or task), as a live
    microphone or phone line would: a server that judged the pause incomplete (turn.detector
    semantic) ends the turn only after its maximum silence, which it counts in audio received."""
    frame = frames_for(np.zeros(rate * FRAME_MS // 1000, np.float32), rate)[0]
    t0 = time.perf_counter()
    i = 0
    while not done.done():
        await ws.send(p.encode(p.Audio(frame), binary))
        i += 1
        await asyncio.wait({done}, timeout=max(0.0, t0 + i * FRAME_MS / 1000
                                               - time.perf_counter()))


def load_for_streaming(path: str) -> tuple[np.ndarray, int]:
    """Read a WAV; rates the server does not take are resampled to 16 kHz here."""
    x, rate = read_wav(path)
    if rate not in SUPPORTED_SAMPLE_RATES:
        import soxr

        x, rate = soxr.resample(x, rate, 16000).astype(np.float32), 16000
    return x, rate


SPEAK_RATE = 24000


def main(files: list[str], url: str, realtime: bool = True, speak_to: str | None = None) -> int:
    turns = [load_for_streaming(f) for f in files]
    output_audio = p.OutputAudio("pcm16", SPEAK_RATE) if speak_to else None

    def show(ev: dict) -> None:
        kind = ev["type"]
        if kind == "session.started":
            print(f"session {ev['session_id']}")
        elif kind == "vad.speech_started":
            print(f"[speech started at {ev['audio_ms']} ms]")
        elif kind == "vad.speech_stopped":
            print(f"[speech stopped at {ev['audio_ms']} ms]")
        elif kind == "transcript.final":
            print(f"you:   {ev['text']}")
            if ev["text"]:
                print("agent: ", end="", flush=True)
        elif kind == "response.token":
            print(ev["text"], end="", flush=True)
        elif kind == "response.done":
            print(f"\n[{ev['finish_reason']}, {ev['tokens']} tokens]")
        elif kind == "turn.latency":
            print(format_table([ev["stages"]], labels=[str(ev["turn_id"])]))
        elif kind == "error":
            print(f"error {ev['code']}: {ev['message']}", file=sys.stderr)

    try:
        result = asyncio.run(stream_audio(url, turns, realtime=realtime, on_event=show,
                                          output_audio=output_audio))
    except OSError as exc:
        print(f"voicert client: cannot connect to {url}: {exc}", file=sys.stderr)
        return 2
    if len(result.turns) > 1:
        print("\nall turns (ms):")
        done = [t for t in result.turns if t.latency]
        print(format_table([t.latency for t in done], labels=[str(t.turn_id) for t in done]))
    if speak_to:
        from voicert.audio.pcm import decode_pcm
        from voicert.audio.wav import write_wav

        audio = b"".join(bytes(t.audio) for t in result.turns)
        write_wav(speak_to, decode_pcm(audio, "pcm16"), SPEAK_RATE)
        print(f"wrote {len(audio) / 2 / SPEAK_RATE:.1f} s of spoken replies to {speak_to}")
    return 1 if result.errors else 0
