"""``voicert client FILE.wav``: stream a WAV at real-time pace over the native protocol and print the
transcript, the reply as it streams, and each turn's latency table. Also a small library for tests
and the load generator: :func:`stream_wav` returns what the server sent."""

from __future__ import annotations

import asyncio
import base64
import os
import struct
import sys
import time
import urllib.parse
import wave
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

from voicert.audio.pcm import encode_pcm16
from voicert.audio.wav import read_wav
from voicert.client_mic import start_session
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
    unheard: list[int] = field(
        default_factory=list
    )  # indexes of clips the server heard no speech in


class ClientError(Exception):
    """A mistake the user can put right, said in one line (``voicert client`` prints it, not a
    traceback)."""


STREAM_PATH = "/v1/stream"
WAV_HINT = "convert it first, e.g. ffmpeg -i {path} -ac 1 -ar 16000 {stem}-16k.wav"
# what a file that is not a WAV most likely is, from its first bytes
SNIFF = (
    (b"ID3", "an MP3 file"),
    (b"\xff\xfb", "an MP3 file"),
    (b"\xff\xf3", "an MP3 file"),
    (b"OggS", "an Ogg file"),
    (b"fLaC", "a FLAC file"),
    (b"\x1aE\xdf\xa3", "a WebM file"),
    (b"caff", "a CAF file"),
    (b"FORM", "an AIFF file"),
)


DEFAULT_SERVER = "ws://127.0.0.1:8765"


def server_env(environ: dict[str, str] | None = None) -> str:
    """The server every client and load generator finds by default: ``$VOICERT_URL`` (any of
    the forms :func:`door_url` takes), else this machine's default port."""
    env = os.environ if environ is None else environ
    return env.get("VOICERT_URL") or DEFAULT_SERVER


def door_url(url: str, path: str, http: bool = False) -> str:
    """A door's URL from what a user may type: ``http(s)://`` and ``ws(s)://`` are the same server,
    and a URL without a path (``ws://HOST:PORT``) gets ``path``; one with a path keeps it.
    ``http``: the ``http(s)://`` form (the HTTP API). Raises :class:`ClientError`."""
    parts = urllib.parse.urlsplit(url)
    secure = {"ws": False, "wss": True, "http": False, "https": True}.get(parts.scheme.lower())
    if secure is None or not parts.netloc:
        raise ClientError(
            f"--url {url}: give the server as ws://HOST:PORT (or http://HOST:PORT, or the door's "
            f"whole URL: ws://HOST:PORT{path})"
        )
    scheme = ("https" if secure else "http") if http else ("wss" if secure else "ws")
    keep = parts.path not in ("", "/") and not http
    return urllib.parse.urlunsplit(
        (scheme, parts.netloc, parts.path if keep else path, parts.query, "")
    )


# the server's other doors (server/app.py's routes), which speak other protocols than this client
OTHER_DOORS = {
    "/v1/realtime": "the OpenAI Realtime door (for OpenAI's SDKs and Realtime clients)",
    "/twilio": "Twilio's media-stream door (a phone call's audio, from Twilio)",
    "/telnyx": "Telnyx's media-stream door (a phone call's audio, from Telnyx)",
    "/plivo": "Plivo's audio-stream door (a phone call's audio, from Plivo)",
    "/v1/dashboard": "the dashboard's feed (for the page at /dashboard)",
}


def stream_url(url: str) -> str:
    """The native stream's ``ws(s)://`` URL (:func:`door_url` with ``/v1/stream``). Raises
    :class:`ClientError` at once for another door of the server, naming it."""
    out = door_url(url, STREAM_PATH)
    path = urllib.parse.urlsplit(out).path.rstrip("/")
    if path in OTHER_DOORS:
        base = urllib.parse.urlunsplit(urllib.parse.urlsplit(out)._replace(path=STREAM_PATH))
        raise ClientError(
            f"--url {url}: that is {OTHER_DOORS[path]}; voicert client speaks the native "
            f"protocol: --url {base}"
        )
    return out


def load_clip(path: str) -> tuple[np.ndarray, int]:
    """:func:`load_for_streaming`, with a :class:`ClientError` that says what is wrong with a file
    that is missing or not a WAV."""
    file = Path(path)
    if not file.exists():
        raise ClientError(f"{path}: no such file")
    if not file.is_file():
        raise ClientError(f"{path}: not a file")
    try:
        x, rate = load_for_streaming(path)
    except (wave.Error, EOFError, ValueError, struct.error) as exc:
        with open(file, "rb") as f:
            head = f.read(4)
        what = next((name for magic, name in SNIFF if head.startswith(magic)), None)
        said = str(exc).removeprefix(f"{path}: ").removeprefix("not a WAV file ").strip("()")
        why = f"{what}, not a WAV" if what else f"not a WAV file ({said or 'cut short'})"
        if head == b"RIFF" and str(exc).startswith(f"{path}: unsupported"):
            why = str(exc).removeprefix(f"{path}: ")  # a WAV, in an encoding we do not read
        raise ClientError(f"{path}: {why}; " + WAV_HINT.format(path=path, stem=file.stem)) from None
    except OSError as exc:
        raise ClientError(f"{path}: {exc.strerror or exc}") from None
    if x.size == 0:
        raise ClientError(f"{path}: the WAV holds no audio")
    return x, rate


def frames_for(x: np.ndarray, rate: int, frame_ms: int = FRAME_MS) -> list[bytes]:
    n = rate * frame_ms // 1000
    return [encode_pcm16(x[i : i + n]) for i in range(0, x.size, n)]


def _track(turn: TurnResult, ev: dict) -> bool:
    """Fold one of the turn's server events into ``turn``; True once the turn is over (its
    latency came, or its transcript was empty: nothing to answer)."""
    kind = ev["type"]
    if kind == "transcript.final":
        turn.transcript = ev["text"]
        return not ev["text"]
    if kind == "response.token":
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
        return True
    return False


async def stream_audio(
    url: str,
    turns: list[tuple[np.ndarray, int]],
    *,
    realtime: bool = True,
    trailing_silence_s: float = 1.0,
    turn_timeout_s: float = 120.0,
    system_prompt: str | None = None,
    binary: bool = True,
    output_audio: p.OutputAudio | None = None,
    on_event: Callable[[dict], None] | None = None,
    until_answered: bool = True,
    unheard_after_s: float | None = None,
    headers: dict[str, str] | None = None,
    voice: str | None = None,
    texts: tuple[str, ...] = (),
    rate: int = 16000,
) -> ClientResult:
    """Open one session; for each (samples, rate) in ``turns`` stream the audio plus trailing
    silence in 20 ms frames, then wait for that turn's ``turn.latency`` before the next, sending
    silence meanwhile as a live microphone would (``until_answered``; False: nothing more, so that
    the server receives exactly the same audio on every run). ``unheard_after_s``: a clip in which
    the server has not heard speech start this long after its last frame is given up on (its
    index goes to ``result.unheard``) instead of waited on for ``turn_timeout_s``. ``voice``: one
    of the server's voices (``session.started`` lists them; None: its default). Raises
    ``TimeoutError`` when a turn is not answered within ``turn_timeout_s``, ``RuntimeError`` when
    the session is refused, and websockets' errors when the connection fails or closes.
    ``texts``: typed turns (``user.text``), each answered before the next, after the audio ones;
    ``rate``: the session's input rate when there is no audio turn."""
    rate = turns[0][1] if turns else rate
    result = ClientResult()
    async with connect(url, max_size=None, compression=None, additional_headers=headers) as ws:
        start = p.SessionStart(
            sample_rate=rate, system_prompt=system_prompt, output_audio=output_audio, voice=voice
        )
        msg = await start_session(ws, start, binary)
        result.session_id = msg["session_id"]
        result.events.append(msg)
        if on_event:
            on_event(msg)
        turn_done = asyncio.Event()
        speech_heard = asyncio.Event()
        current: dict[int, TurnResult] = {}

        async def reader() -> None:
            async for frame in ws:
                ev = p.decode_server(frame)
                result.events.append(ev)
                if on_event:
                    on_event(ev)
                kind = ev["type"]
                if kind == "vad.speech_started":
                    speech_heard.set()
                if kind == "error":
                    result.errors.append(ev)
                tid = None if kind.startswith("vad.") else ev.get("turn_id")
                if not isinstance(tid, int):
                    continue
                turn = current.get(tid)
                if turn is None:
                    turn = current[tid] = TurnResult(tid)
                    result.turns.append(turn)
                if _track(turn, ev):
                    turn_done.set()

        read_task = asyncio.create_task(reader())
        silence = np.zeros(int(rate * trailing_silence_s), np.float32)
        try:
            for index, (samples, _) in enumerate(turns):
                turn_done.clear()
                speech_heard.clear()
                t0 = time.perf_counter()
                frames = frames_for(np.concatenate([samples, silence]), rate)
                for i, frame in enumerate(frames):
                    await ws.send(p.encode(p.Audio(frame), binary))
                    if realtime:
                        delay = t0 + (i + 1) * FRAME_MS / 1000 - time.perf_counter()
                        if delay > 0:
                            await asyncio.sleep(delay)
                if unheard_after_s is not None and not await _heard(
                    ws, speech_heard, rate, binary, unheard_after_s
                ):
                    result.unheard.append(index)
                    continue
                answered = asyncio.ensure_future(turn_done.wait())
                try:
                    waiting = (
                        send_silence_until(ws, answered, rate, binary)
                        if until_answered
                        else answered
                    )
                    await asyncio.wait_for(waiting, turn_timeout_s)
                finally:
                    answered.cancel()
            for text in texts:
                turn_done.clear()
                if on_event:
                    on_event({"type": "user.text", "text": text})
                await ws.send(p.encode(p.UserText(text), binary))
                await asyncio.wait_for(turn_done.wait(), turn_timeout_s)
            await ws.send(p.encode(p.SessionEnd(), binary))
            await asyncio.wait_for(read_task, 30)
        finally:
            read_task.cancel()
    return result


async def _heard(ws, speech_heard: asyncio.Event, rate: int, binary: bool, wait_s: float) -> bool:
    """Whether the server says it heard speech start within ``wait_s`` (silence goes on meanwhile,
    as from a live microphone)."""
    heard = asyncio.ensure_future(speech_heard.wait())
    try:
        await asyncio.wait_for(send_silence_until(ws, heard, rate, binary), wait_s)
    except TimeoutError:
        pass
    finally:
        heard.cancel()
    return speech_heard.is_set()


async def send_silence_until(
    ws,
    done: asyncio.Future,
    rate: int,
    binary: bool = True,
    on_frame: Callable[[], None] | None = None,
) -> None:
    """Go on sending silence at real-time pace until ``done`` (a future or task), as a live
    microphone or phone line would: a server that judged the pause incomplete (turn.detector
    semantic) ends the turn only after its maximum silence, which it counts in audio received.
    ``on_frame`` is called after each frame is sent."""
    frame = frames_for(np.zeros(rate * FRAME_MS // 1000, np.float32), rate)[0]
    t0 = time.perf_counter()
    i = 0
    while not done.done():
        await ws.send(p.encode(p.Audio(frame), binary))
        if on_frame is not None:
            on_frame()
        i += 1
        await asyncio.wait({done}, timeout=max(0.0, t0 + i * FRAME_MS / 1000 - time.perf_counter()))


def load_for_streaming(path: str) -> tuple[np.ndarray, int]:
    """Read a WAV; rates the server does not take are resampled to 16 kHz here."""
    x, rate = read_wav(path)
    if rate not in SUPPORTED_SAMPLE_RATES:
        x, rate = to_16k(x, rate), 16000
    return x, rate


def to_16k(x: np.ndarray, rate: int) -> np.ndarray:
    """``x`` [N] float32 at ``rate`` resampled to 16 kHz (soxr)."""
    import soxr

    return soxr.resample(x, rate, 16000).astype(np.float32)


SPEAK_RATE = 24000


def main(
    files: list[str],
    url: str,
    realtime: bool = True,
    speak_to: str | None = None,
    token: str | None = None,
    voice: str | None = None,
    texts: tuple[str, ...] = (),
    mic: bool = False,
    max_turns: int = 0,
) -> int:
    """``voicert client``: 0 when every turn was answered, 1 when the server reported an error or
    heard no speech in a clip, 2 when the files, the URL or the connection are wrong (one line
    on stderr each, never a traceback), 130 on Ctrl-C. ``mic``: turns from the microphone
    (``voicert/client_mic.py``) until Ctrl-C, which then ends it with 0, or ``max_turns``."""
    try:
        if mic:
            return _run_mic(url, token, voice, max_turns)
        return _run(files, url, realtime, speak_to, token, voice, texts)
    except ClientError as exc:
        print(f"voicert client: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("\nvoicert client: interrupted", file=sys.stderr)
        return 130


def _run(
    files: list[str],
    url: str,
    realtime: bool,
    speak_to: str | None,
    token: str | None,
    voice: str | None = None,
    texts: tuple[str, ...] = (),
) -> int:
    turns = [load_clip(f) for f in files]
    url = stream_url(url)
    if len({rate for _, rate in turns}) > 1:
        turns = [(x, r) if r == 16000 else (to_16k(x, r), 16000) for x, r in turns]
    output_audio = p.OutputAudio("pcm16", SPEAK_RATE) if speak_to else None

    def show(ev: dict) -> None:
        show_event(ev, bool(speak_to))

    headers = {"Authorization": f"Bearer {token}"} if token else None
    try:
        result = asyncio.run(
            stream_audio(
                url,
                turns,
                realtime=realtime,
                on_event=show,
                output_audio=output_audio,
                headers=headers,
                unheard_after_s=UNHEARD_AFTER_S,
                voice=voice,
                turn_timeout_s=TURN_TIMEOUT_S,
                texts=texts,
            )
        )
    except TimeoutError:
        raise ClientError(f"no answer from {url} within {TURN_TIMEOUT_S:g} s") from None
    except (InvalidStatus, ConnectionClosed, RuntimeError, OSError) as exc:
        raise _connection_error(url, exc) from None
    for index in result.unheard:
        print(
            f"voicert client: {files[index]}: the server heard no speech in it (silence, or too "
            "quiet for its voice detector); no turn",
            file=sys.stderr,
        )
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
    return 1 if result.errors or result.unheard else 0


def _run_mic(url: str, token: str | None, voice: str | None, max_turns: int) -> int:
    from voicert import client_mic

    url = stream_url(url)
    headers = {"Authorization": f"Bearer {token}"} if token else None

    async def session() -> int:
        with client_mic.Microphone(client_mic.sounddevice_module()) as mic:
            print("listening: speak, and stop with Ctrl-C", flush=True)
            return await client_mic.talk(
                url, mic, show_event, max_turns=max_turns, headers=headers, voice=voice
            )

    try:
        asyncio.run(session())
    except client_mic.MicError as exc:
        raise ClientError(str(exc)) from None
    except KeyboardInterrupt:
        print("\nvoicert client: stopped", file=sys.stderr)
    except (InvalidStatus, ConnectionClosed, RuntimeError, OSError) as exc:
        raise _connection_error(url, exc) from None
    return 0


def _connection_error(url: str, exc: Exception) -> ClientError:
    """What a session's failure means for the user: refused at the handshake, closed by the
    server, refused by it (RuntimeError: ``session.started`` did not come), or no connection."""
    if isinstance(exc, InvalidStatus):
        return ClientError(refused(url, exc.response.status_code))
    if isinstance(exc, ConnectionClosed):
        rcvd = exc.rcvd
        why = f"{rcvd.code} {rcvd.reason}".strip() if rcvd else "without a close frame"
        return ClientError(f"the server closed the connection ({why})")
    if isinstance(exc, OSError):
        return ClientError(f"cannot connect to {url}: {exc.strerror or exc}")
    return ClientError(str(exc))


def show_event(ev: dict, speaking: bool = False) -> None:
    """Print one event of the session as the client shows it (``user.text``: the client's own
    typed turn, as sent)."""
    kind = ev["type"]
    if kind == "session.started":
        print(
            f"session {ev['session_id']} (model {ev.get('model') or '?'}"
            + (
                f"; voice {ev['voice']}, offered: {', '.join(ev.get('voices', []))}"
                if speaking and ev.get("voice")
                else ""
            )
            + ")"
        )
    elif kind == "vad.speech_started":
        print(f"[speech started at {ev['audio_ms']} ms]")
    elif kind == "vad.speech_stopped":
        print(f"[speech stopped at {ev['audio_ms']} ms]")
    elif kind == "user.text":
        print(f"you:   {ev['text']}\nagent: ", end="", flush=True)
    elif kind == "transcript.final":
        print(f"you:   {ev['text']}")
        if ev["text"]:
            print("agent: ", end="", flush=True)
    elif kind == "response.token":
        print(ev["text"], end="", flush=True)
    elif kind == "tool.call":
        who = "the server runs it" if ev.get("server") else "the client would run it"
        print(f"\n[tool call {ev['name']}({ev['arguments']}): {who}]")
    elif kind == "tool.output":
        print(f"[tool output{' (error)' if ev.get('error') else ''}: {ev['output']}]")
    elif kind == "response.done":
        print(f"\n[{ev['finish_reason']}, {ev['tokens']} tokens]")
    elif kind == "turn.latency":
        print(format_table([ev["stages"]], labels=[str(ev["turn_id"])]))
    elif kind == "error":
        print(f"error {ev['code']}: {ev['message']}", file=sys.stderr)


UNHEARD_AFTER_S = 5.0  # after a clip's last frame, for the server to say it heard speech start
TURN_TIMEOUT_S = 120.0


def refused(url: str, status: int) -> str:
    """What an HTTP status in answer to the WebSocket handshake means for the user."""
    hint = {
        401: "it wants a token: give --token (or set VOICERT_TOKEN)",
        403: "this token or origin is not allowed",
        404: f"nothing is served at that path (the native stream is {STREAM_PATH})",
        503: "it is full or still starting: try again shortly",
    }.get(status, "")
    return f"the server refused the connection to {url}: HTTP {status}" + (
        f"; {hint}" if hint else ""
    )
