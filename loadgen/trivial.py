"""A trivial server for validating the load generator: it speaks the native protocol and answers
each turn the instant the caller's last frame of speech arrives, with no models, so whatever the
load generator reports against it is the generator's own error (and the network's).

It is given the same WAV files as the load generator and knows each clip's frames: a turn's clip
is recognised by its first frame that is not digital silence, and the answer (``response.started``,
one ``response.token``, ``response.done``, ``turn.latency``) goes out when the clip's last frame
arrives, the frame the caller measures client-side TTFT from. ``turn.latency`` says
``voice_to_first_token_ms`` and ``ttft_ms``: that frame's arrival -> the token's send (~0). So at
every level, the client-side TTFT is the time a frame takes to leave the generator and an answer
to be read by it: the generator's measurement error.

    python -m loadgen.trivial --port 8766 --procs 4
    python -m loadgen --url ws://127.0.0.1:8766/v1/stream --sweep 64,256,1024 --procs 8
"""

from __future__ import annotations

import argparse
import asyncio
import glob
import multiprocessing as mp
import signal
import socket
import time
import uuid

from websockets.asyncio.server import ServerConnection, serve
from websockets.exceptions import ConnectionClosed

from voicert.audio.pcm import encode_pcm16
from voicert.client import load_for_streaming
from voicert.protocol import native as p
from voicert.server.workers import listening_sockets

FRAME_MS = 20


def clip_table(paths: list[str]) -> dict[bytes, int]:
    """The first non-silent frame of each clip, as the load generator encodes it -> how many
    frames of that clip follow it."""
    table: dict[bytes, int] = {}
    for path in paths:
        audio, rate = load_for_streaming(path)
        n = rate * FRAME_MS // 1000
        frames = [encode_pcm16(audio[i : i + n]) for i in range(0, audio.size, n)]
        first = next(i for i, f in enumerate(frames) if any(f))
        table[frames[first]] = len(frames) - 1 - first
    return table


async def _session(ws: ServerConnection, table: dict[bytes, int]) -> None:
    turn = samples = 0  # samples: the session's audio position, as a server counts it
    rate = p.SessionStart().sample_rate  # until session.start says otherwise
    left: int | None = None  # frames of the current clip still to come
    try:
        async for frame in ws:
            try:
                msg = p.decode_client(frame)
            except p.ProtocolError as exc:
                await ws.send(p.encode(p.Error(exc.code.value, exc.message)))
                continue
            if isinstance(msg, p.SessionStart):
                rate = msg.sample_rate
                await ws.send(
                    p.encode(
                        p.SessionStarted(
                            uuid.uuid4().hex[:12], msg.sample_rate, "pcm16", "server_vad"
                        )
                    )
                )
            elif isinstance(msg, p.Audio):
                arrived = time.perf_counter_ns()
                samples += len(msg.audio) // 2  # pcm16
                if left is None:
                    left = table.get(msg.audio)
                elif left > 0:
                    left -= 1
                if left == 0:
                    turn += 1
                    left = None
                    await _answer(ws, turn, arrived, samples * 1000 // rate)
            elif isinstance(msg, p.SessionEnd):
                return
    except ConnectionClosed:
        return


async def _answer(ws: ServerConnection, turn: int, arrived_ns: int, audio_ms: int) -> None:
    """The turn ends on the frame that just arrived (``audio_ms``: the position after it), as a
    server's endpoint decision would say, and is answered at once."""
    await ws.send(p.encode(p.SpeechStopped(audio_ms, turn)))
    await ws.send(p.encode(p.ResponseStarted(turn)))
    await ws.send(p.encode(p.ResponseToken(turn, 0, "ok")))
    ms = (time.perf_counter_ns() - arrived_ns) / 1e6
    await ws.send(p.encode(p.ResponseDone(turn, "ok", 1, 1, "stop")))
    await ws.send(p.encode(p.TurnLatency(turn, {"ttft_ms": ms, "voice_to_first_token_ms": ms})))


def _serve(sock: socket.socket, table: dict[bytes, int]) -> None:
    """One process: a websockets server on its share of the port, until SIGTERM/SIGINT."""
    try:
        import uvloop

        loop = uvloop.new_event_loop()
    except ImportError:
        loop = asyncio.new_event_loop()

    async def main() -> None:
        stop = asyncio.Event()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        async with serve(
            lambda ws: _session(ws, table),
            sock=sock,
            compression=None,
            ping_interval=None,
            max_queue=None,
        ):
            await stop.wait()

    loop.run_until_complete(main())


def _interrupt(signum, frame) -> None:
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m loadgen.trivial", description=__doc__.split("\n")[0]
    )
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8766)
    ap.add_argument("--procs", type=int, default=1, help="processes sharing the port")
    ap.add_argument(
        "--wav",
        nargs="+",
        default=sorted(glob.glob("tests/data/*.wav")),
        help="the clips the load generator sends (the same list)",
    )
    args = ap.parse_args(argv)
    table = clip_table(args.wav)
    socks = listening_sockets(args.host, args.port, args.procs)
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_serve, args=(s, table), daemon=True) for s in socks]
    for proc in procs:
        proc.start()
    print(
        f"trivial server on ws://{args.host}:{socks[0].getsockname()[1]}/v1/stream "
        f"({args.procs} processes)",
        flush=True,
    )
    signal.signal(signal.SIGTERM, _interrupt)  # stop as on Ctrl-C: the children with us
    try:
        for proc in procs:
            proc.join()
    except KeyboardInterrupt:
        pass
    for proc in procs:
        proc.terminate()
        proc.join(5)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
