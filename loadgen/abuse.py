"""``python -m loadgen.abuse``: does one abusive client slow everyone else's first token?

Normal callers (``--callers``) ask short streamed chat completions in a closed loop; their TTFT
(request sent -> first content token) is measured first alone, then beside one abuser at a time,
then beside all of them at once (``--seconds`` each):

- ``history``: a chat completion with ``--history`` messages (a huge conversation), again and again;
- ``schema``: tools whose regex ``pattern`` is hostile (``^((a{100}){100}){100}$``), tool choice
  ``required``;
- ``stops``: four stop strings of 200,000 characters each;
- ``audio``: a /v1/stream session pushing 512 KiB audio frames (16 s each) as fast as the socket
  takes them.

The table gives the normal callers' TTFT P50 / P95 / P99, the ratio of P99 to the figure without
the abuser, errors among the normal requests, and what the abuser was answered (status codes, or
the audio session's errors). The target ("Hostile input, round two"): normal TTFT P99 within 2x.

    python -m loadgen.abuse --url http://127.0.0.1:8765 [--callers 4] [--seconds 20]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import sys
import time
from urllib.parse import urlsplit

from loadgen.report import pcts
from voicert.client import ClientError, door_url, server_env

ABUSERS = ("history", "schema", "stops", "audio")
HOSTILE_PATTERN = "^((a{100}){100}){100}$"


async def _post(host: str, port: int, body: dict):
    """(reader, writer) of a chat completion request sent on its own connection."""
    payload = json.dumps(body).encode()
    reader, writer = await asyncio.open_connection(host, port, limit=2**20)
    writer.write(
        (
            f"POST /v1/chat/completions HTTP/1.1\r\nHost: {host}:{port}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\n"
            "Connection: close\r\n\r\n"
        ).encode()
        + payload
    )
    await writer.drain()
    return reader, writer


MODEL = ["voicert"]  # the served model's id, read from /v1/models at the start


def served_model(url: str) -> str:
    import urllib.request

    with urllib.request.urlopen(f"{url.rstrip('/')}/v1/models", timeout=30) as r:
        return json.load(r)["data"][0]["id"]


async def first_token_ms(host: str, port: int, n: int) -> float | None:
    """One normal streamed request: ms from sending to its first content token (None: an
    error or no token)."""
    body = {
        "model": MODEL[0],
        "messages": [{"role": "user", "content": f"Say hello to caller number {n}."}],
        "max_tokens": 8,
        "stream": True,
    }
    t0 = time.perf_counter_ns()
    reader, writer = await _post(host, port, body)
    try:
        status = (await reader.readline()).split(b" ", 2)[1]
        if status != b"200":
            return None
        while line := await reader.readline():
            if not line.startswith(b"data: {"):
                continue
            delta = json.loads(line[6:])["choices"][0]["delta"]
            if delta.get("content"):
                return (time.perf_counter_ns() - t0) / 1e6
        return None
    finally:
        writer.close()


async def normal_caller(host: str, port: int, stop_at: float, ttfts: list, errors: list) -> None:
    n = 0
    while time.monotonic() < stop_at:
        n += 1
        try:
            ms = await asyncio.wait_for(first_token_ms(host, port, n), 120)
        except (OSError, TimeoutError, ValueError, IndexError) as exc:
            errors.append(type(exc).__name__)
            continue
        if ms is None:
            errors.append("error answer")
        else:
            ttfts.append(ms)


def abusive_body(kind: str, history: int) -> dict:
    base = {"model": MODEL[0], "max_tokens": 16}
    if kind == "history":
        turns = [
            {"role": "user" if i % 2 == 0 else "assistant", "content": f"message {i}, go on"}
            for i in range(history)
        ]
        return {**base, "messages": [*turns, {"role": "user", "content": "and now?"}]}
    ask = [{"role": "user", "content": "Book it."}]
    if kind == "schema":
        params = {
            "type": "object",
            "properties": {"code": {"type": "string", "pattern": HOSTILE_PATTERN}},
            "required": ["code"],
        }
        tool = {"type": "function", "function": {"name": "book", "parameters": params}}
        return {**base, "messages": ask, "tools": [tool], "tool_choice": "required"}
    if kind == "stops":
        return {**base, "messages": ask, "stop": [c * 200_000 for c in "wxyz"]}
    raise ValueError(kind)


async def http_abuser(host: str, port: int, kind: str, history: int, stop_at: float, seen) -> None:
    body = abusive_body(kind, history)
    while time.monotonic() < stop_at:
        try:
            reader, writer = await _post(host, port, body)
            try:
                line = await asyncio.wait_for(reader.readline(), 120)
                seen[f"{kind}: {line.split(b' ', 2)[1].decode()}"] += 1
                await asyncio.wait_for(reader.read(), 120)
            finally:
                writer.close()
        except (OSError, TimeoutError, IndexError) as exc:
            seen[f"{kind}: {type(exc).__name__}"] += 1
            await asyncio.sleep(0.1)


async def audio_abuser(ws_url: str, stop_at: float, seen) -> None:
    """One session sending 512 KiB frames of audio (16 s each) as fast as it can; a close
    counts as the server's answer, and it connects again."""
    from websockets.asyncio.client import connect
    from websockets.exceptions import ConnectionClosed

    from voicert.protocol import native as p

    frame = p.encode(p.Audio(bytes(2**19)))
    while time.monotonic() < stop_at:
        try:
            async with connect(ws_url, max_size=None) as ws:
                await ws.send(p.encode(p.SessionStart(sample_rate=16000)))
                reader = asyncio.create_task(_count_errors(ws, seen))
                while time.monotonic() < stop_at:
                    await ws.send(frame)
                    seen["audio: frames sent"] += 1
                reader.cancel()
        except (OSError, ConnectionClosed) as exc:
            seen[f"audio: {type(exc).__name__}"] += 1
            await asyncio.sleep(0.1)


async def _count_errors(ws, seen) -> None:
    from websockets.exceptions import ConnectionClosed

    from voicert.protocol import native as p

    try:
        async for msg in ws:
            event = p.decode_server(msg)
            if event["type"] == "error":
                seen[f"audio: error {event.get('code', '?')}"] += 1
    except ConnectionClosed as exc:
        seen[f"audio: closed {exc.rcvd.code if exc.rcvd else 'without a code'}"] += 1


async def phase(url: str, callers: int, seconds: float, abusers: tuple[str, ...], history: int):
    """(normal TTFTs, normal errors, what the abusers were answered) over one phase."""
    parts = urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 80
    ws_url = f"ws://{host}:{port}/v1/stream"
    stop_at = time.monotonic() + seconds
    ttfts: list[float] = []
    errors: list[str] = []
    seen: collections.Counter = collections.Counter()
    tasks = [normal_caller(host, port, stop_at, ttfts, errors) for _ in range(callers)]
    for kind in abusers:
        if kind == "audio":
            tasks.append(audio_abuser(ws_url, stop_at, seen))
        else:
            tasks.append(http_abuser(host, port, kind, history, stop_at, seen))
    await asyncio.gather(*tasks)
    return ttfts, errors, seen


async def run(url: str, callers: int, seconds: float, history: int, kinds: list[str]) -> str:
    rows = [
        "| beside | normal requests | TTFT P50 / P95 / P99 | P99 vs alone | normal errors | "
        "the abuser was answered |",
        "|---|---:|---:|---:|---:|---|",
    ]
    MODEL[0] = await asyncio.to_thread(served_model, url)
    await phase(url, callers, min(5.0, seconds), (), history)  # warm-up: not reported
    base_p99 = None
    phases = [("nobody", ()), *[(k, (k,)) for k in kinds], ("all at once", kinds)]
    for name, abusers in [*phases, ("nobody, again", ())]:  # again: the baseline's drift
        if name == "all at once" and len(kinds) < 2:
            continue
        ttfts, errors, seen = await phase(url, callers, seconds, tuple(abusers), history)
        pc = pcts(ttfts) if ttfts else dict.fromkeys(("p50", "p95", "p99"), float("nan"))
        p50, p95, p99 = pc["p50"], pc["p95"], pc["p99"]
        base_p99 = p99 if base_p99 is None else base_p99
        answered = ", ".join(f"{k} x{v}" for k, v in sorted(seen.items())) or "-"
        rows.append(
            f"| {name} | {len(ttfts)} | {p50:.0f} / {p95:.0f} / {p99:.0f} ms | "
            f"{p99 / base_p99:.2f}x | {len(errors)} | {answered} |"
        )
        print(rows[-1], file=sys.stderr, flush=True)
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m loadgen.abuse", description=__doc__)
    ap.add_argument(
        "--url", default=server_env(), help="the server (http:// or ws://; default: $VOICERT_URL)"
    )
    ap.add_argument("--callers", type=int, default=4)
    ap.add_argument("--seconds", type=float, default=20.0, help="each phase")
    ap.add_argument("--history", type=int, default=10_000, help="messages of the huge request")
    ap.add_argument("--abusers", default=",".join(ABUSERS))
    args = ap.parse_args(argv)
    try:
        args.url = door_url(args.url, "", http=True)
    except ClientError as exc:
        ap.error(str(exc))
    kinds = [k for k in args.abusers.split(",") if k]
    unknown = [k for k in kinds if k not in ABUSERS]
    if unknown:
        print(f"loadgen.abuse: unknown abuser(s) {unknown} (known: {', '.join(ABUSERS)})")
        return 2
    try:
        print(asyncio.run(run(args.url, args.callers, args.seconds, args.history, kinds)))
    except (OSError, ValueError) as exc:  # urllib's URLError and HTTPError are OSErrors
        print(f"loadgen.abuse: no server ready at {args.url}: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
