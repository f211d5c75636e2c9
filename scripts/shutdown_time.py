"""How long a SIGTERM takes with live sessions ("Hostile input, round two", item 14).

Starts ``voicert serve`` (the embedded CPU default) on a free port, opens ``--sessions`` native
sessions, each with a reply running (a typed turn asking for a long story), sends SIGTERM once
every reply has started, and times the process's exit. Prints the grace, the exit time, and the
close codes the clients saw (1001: going away).

    python scripts/shutdown_time.py [--sessions 20] [--grace 10]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import signal
import socket
import subprocess
import sys
import time
import urllib.request

from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from voicert.protocol import native as p


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ready(port: int, proc: subprocess.Popen, limit_s: float = 300) -> None:
    t0 = time.monotonic()
    while time.monotonic() - t0 < limit_s:
        if proc.poll() is not None:
            sys.exit(f"the server exited while starting (rc {proc.returncode})")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2):
                return
        except OSError:
            time.sleep(0.5)
    sys.exit("the server was not ready in time")


async def session(url: str, started: asyncio.Event, count: list, codes: collections.Counter):
    async with connect(url) as ws:
        await ws.send(p.encode(p.SessionStart()))
        await ws.send(p.encode(p.UserText("Tell me a very long story about a dragon.")))
        try:
            async for msg in ws:
                token = p.decode_server(msg)["type"] == "response.token"
                if token and not started.is_set():
                    count[0] += 1
                    started.set()
        except ConnectionClosed:
            pass
        codes[ws.close_code] += 1


def start_server(port: int, args) -> subprocess.Popen:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "voicert",
            "serve",
            "--set",
            f"server.port={port}",
            "--set",
            f"server.shutdown_grace_s={args.grace}",
            "--set",
            f"server.max_sessions={max(args.sessions, 16)}",
            "--set",
            "tts.engine=none",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


async def main_async(args) -> None:
    port = free_port()
    proc = start_server(port, args)
    try:
        await asyncio.to_thread(wait_ready, port, proc)
        url = f"ws://127.0.0.1:{port}/v1/stream"
        codes: collections.Counter = collections.Counter()
        count = [0]
        events = [asyncio.Event() for _ in range(args.sessions)]
        tasks = [asyncio.create_task(session(url, e, count, codes)) for e in events]
        await asyncio.wait_for(asyncio.gather(*(e.wait() for e in events)), 600)
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        rc = await asyncio.to_thread(proc.wait, 120)
        exit_s = time.monotonic() - t0
        await asyncio.gather(*tasks, return_exceptions=True)
        print(
            "| sessions replying | shutdown_grace_s | SIGTERM to exit | exit code | close codes |"
        )
        print("|---:|---:|---:|---:|---|")
        print(f"| {count[0]} | {args.grace:g} s | {exit_s:.2f} s | {rc} | {dict(codes)} |")
    finally:
        if proc.poll() is None:
            proc.kill()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sessions", type=int, default=20)
    ap.add_argument("--grace", type=float, default=10.0)
    asyncio.run(main_async(ap.parse_args()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
