"""``voicert client --mic``: talk to the agent from this machine's microphone.

The microphone is read through ``sounddevice`` (PortAudio; an optional package:
``pip install sounddevice``, and on Linux the system's ``libportaudio2``) as 16 kHz mono 16-bit in
20 ms blocks, which go to the server as they come; the server's VAD decides where each turn ends,
and the transcripts and replies print as they stream, as for WAV turns. It runs until Ctrl-C
(or ``--turns N`` answered turns).

PortAudio calls back on its own thread: each block is handed to the event loop, never read there
blocking. No sound device is needed to test it: :class:`Microphone` takes the ``sounddevice``
module it uses, so a stand-in with the same ``RawInputStream`` interface plays a WAV instead.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
from collections.abc import Callable
from types import ModuleType
from typing import Any

from websockets.asyncio.client import connect

from voicert.protocol import native as p

RATE = 16000
BLOCK = RATE * 20 // 1000  # samples in a 20 ms block


class MicError(Exception):
    """No microphone to read: the package, the library or the device is missing."""


def sounddevice_module() -> ModuleType:
    """``sounddevice``, or MicError saying what to install."""
    try:
        return importlib.import_module("sounddevice")
    except (ImportError, OSError) as exc:  # OSError: PortAudio's library is not found
        raise MicError(
            "--mic needs the sounddevice package and PortAudio: pip install sounddevice "
            f"(on Debian/Ubuntu also: apt-get install libportaudio2) ({exc})"
        ) from None


class Microphone:
    """20 ms blocks of 16 kHz mono pcm16 from the default input device, as an async iterator.
    ``sd``: the ``sounddevice`` module (or a stand-in with its ``RawInputStream``)."""

    def __init__(self, sd: ModuleType, max_queued: int = 500) -> None:
        self.sd = sd
        self.queue: asyncio.Queue[bytes] = asyncio.Queue(max_queued)  # 10 s: then blocks drop
        self.dropped = 0
        self.stream: Any = None  # the sounddevice stream, once open

    def _callback(self, loop: asyncio.AbstractEventLoop) -> Callable:
        def on_block(indata, frames, time_info, status) -> None:  # PortAudio's thread
            loop.call_soon_threadsafe(self._put, bytes(indata))

        return on_block

    def _put(self, block: bytes) -> None:
        try:
            self.queue.put_nowait(block)
        except asyncio.QueueFull:
            self.dropped += 1

    def __enter__(self) -> Microphone:
        loop = asyncio.get_running_loop()
        try:
            stream = self.sd.RawInputStream(
                samplerate=RATE,
                blocksize=BLOCK,
                channels=1,
                dtype="int16",
                callback=self._callback(loop),
            )
            stream.start()
            self.stream = stream
        except Exception as exc:  # PortAudioError and its kin: no device, or busy
            raise MicError(f"cannot open the microphone: {exc}") from None
        return self

    def __exit__(self, *exc) -> None:
        if self.stream is not None:
            with contextlib.suppress(Exception):
                self.stream.stop()
                self.stream.close()

    def __aiter__(self) -> Microphone:
        return self

    async def __anext__(self) -> bytes:
        return await self.queue.get()


async def start_session(ws, start: p.SessionStart, binary: bool = True) -> dict:
    """Open a session on the connected socket ``ws``: send ``start`` and return the server's
    ``session.started`` event. Raises RuntimeError, with the server's reason, when it refuses."""
    await ws.send(p.encode(start, binary))
    msg = p.decode_server(await ws.recv())
    if msg["type"] != "session.started":
        raise RuntimeError(f"session refused: {msg.get('message', msg)}")
    return msg


async def talk(
    url: str,
    mic: Microphone,
    on_event: Callable[[dict], None],
    *,
    max_turns: int = 0,
    headers: dict[str, str] | None = None,
    voice: str | None = None,
) -> int:
    """One session fed from ``mic`` until ``max_turns`` turns are answered (0: until cancelled).
    Returns the turns answered. Raises RuntimeError when the session is refused, and websockets'
    errors when the connection fails."""
    answered = 0
    async with connect(url, max_size=None, compression=None, additional_headers=headers) as ws:
        on_event(await start_session(ws, p.SessionStart(sample_rate=RATE, voice=voice)))
        enough = asyncio.Event()

        async def reader() -> None:
            nonlocal answered
            async for frame in ws:
                ev = p.decode_server(frame)
                on_event(ev)
                if ev["type"] == "turn.latency":
                    answered += 1
                    if max_turns and answered >= max_turns:
                        enough.set()

        async def sender() -> None:
            async for block in mic:
                await ws.send(p.encode(p.Audio(block)))

        tasks: list[asyncio.Task] = [asyncio.create_task(reader()), asyncio.create_task(sender())]
        waiter: asyncio.Task = asyncio.create_task(enough.wait())
        try:
            await asyncio.wait([*tasks, waiter], return_when=asyncio.FIRST_COMPLETED)
            for t in tasks:
                if t.done() and t.exception() is not None:
                    raise t.exception()  # type: ignore[misc]
        finally:
            for t in (*tasks, waiter):
                t.cancel()
        with contextlib.suppress(Exception):
            await ws.send(p.encode(p.SessionEnd()))
    return answered
