"""``voicert client --mic`` through a stand-in sound device: a ``sounddevice``-shaped module whose
input stream plays a WAV (then silence) from its own thread in 20 ms blocks, as PortAudio calls
back. The real server hears the question and answers it; a missing package or device is one
line."""

from __future__ import annotations

import asyncio
import threading
import time
import types
from pathlib import Path

import numpy as np
import pytest
import soxr

from voicert import client_mic
from voicert.audio.wav import read_wav

DATA = Path(__file__).parent / "data"


def standin_device(wav: Path, pace: float = 1.5) -> types.ModuleType:
    """A ``sounddevice`` stand-in whose default input plays ``wav`` then silence, ``pace`` times
    faster than real time, in blocks of the size asked for, on a thread of its own."""
    x, rate = read_wav(wav)
    pcm = (np.clip(soxr.resample(x, rate, 16000), -1, 1) * 32767).astype("<i2")
    opened: list = []

    class RawInputStream:
        def __init__(self, samplerate, blocksize, channels, dtype, callback):
            assert (samplerate, channels, dtype) == (16000, 1, "int16")
            self.block, self.callback = blocksize, callback
            self.running = threading.Event()
            opened.append(self)

        def start(self):
            self.running.set()
            threading.Thread(target=self._play, daemon=True).start()

        def _play(self):
            i = 0
            while self.running.is_set():
                chunk = pcm[i * self.block : (i + 1) * self.block]
                chunk = np.pad(chunk, (0, self.block - chunk.size))  # then silence
                self.callback(memoryview(chunk.tobytes()), self.block, None, None)
                i += 1
                time.sleep(self.block / 16000 / pace)

        def stop(self):
            self.running.clear()

        def close(self):
            pass

    return types.SimpleNamespace(RawInputStream=RawInputStream, opened=opened)


async def test_the_microphone_turn_is_heard_and_answered(server):
    device = standin_device(DATA / "capital_of_france.wav")
    events: list[dict] = []
    url = f"ws://127.0.0.1:{server.port}/v1/stream"
    with client_mic.Microphone(device) as mic:
        talking = client_mic.talk(url, mic, events.append, max_turns=1)
        answered = await asyncio.wait_for(talking, 180)  # a hang fails, not blocks the suite
    assert answered == 1
    finals = [e["text"] for e in events if e["type"] == "transcript.final"]
    assert "capital" in finals[0].lower()
    reply = "".join(e["text"] for e in events if e["type"] == "response.token")
    assert "paris" in reply.lower()
    assert not device.opened[0].running.is_set()  # the device is stopped with the session


def test_without_sounddevice_mic_says_what_to_install(monkeypatch, capsys):
    import importlib

    from voicert import cli

    real = importlib.import_module

    def no_sounddevice(name, *args):
        if name == "sounddevice":
            raise ImportError("No module named 'sounddevice'")
        return real(name, *args)

    monkeypatch.setattr(client_mic.importlib, "import_module", no_sounddevice)
    assert cli.main(["client", "--mic", "--url", "ws://127.0.0.1:9"]) == 2
    err = capsys.readouterr().err
    assert "pip install sounddevice" in err and "Traceback" not in err


def test_mic_takes_no_wavs(capsys):
    from voicert import cli

    assert cli.main(["client", "--mic", "x.wav"]) == 2
    assert "--mic takes no WAV files" in capsys.readouterr().err


def test_a_device_that_will_not_open_is_one_line(capsys):
    class Broken:
        def RawInputStream(self, **kw):
            raise RuntimeError("Error querying device -1")

    async def opened():
        with client_mic.Microphone(Broken()):  # type: ignore[arg-type]
            pass

    with pytest.raises(client_mic.MicError, match="cannot open the microphone"):
        asyncio.run(opened())


class _Socket:
    """A connected socket stand-in: records what is sent, answers ``reply`` to the first recv."""

    def __init__(self, reply) -> None:
        self.sent: list = []
        self.reply = reply

    async def send(self, frame) -> None:
        self.sent.append(frame)

    async def recv(self):
        return self.reply


async def test_a_session_opens_with_session_start_and_a_refusal_says_the_servers_reason():
    from voicert.protocol import native as p

    started = p.SessionStarted("s1", 16000, "pcm16", "server_vad")
    ok = _Socket(p.encode(started))
    msg = await client_mic.start_session(ok, p.SessionStart(sample_rate=16000))
    assert msg["type"] == "session.started" and msg["session_id"] == "s1"
    assert p.decode_client(ok.sent[0]).sample_rate == 16000
    refused = _Socket(p.encode(p.Error("too_many_sessions", "the server is full", fatal=True)))
    with pytest.raises(RuntimeError, match="session refused: the server is full"):
        await client_mic.start_session(refused, p.SessionStart(sample_rate=16000))
