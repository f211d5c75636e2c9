"""``python -m loadgen.pressure``: does one session's long conversation slow another's turn?

One caller on /v1/realtime adds ``--items`` conversation items (each ``--chars`` long), then asks
for a reply; meanwhile another caller on /v1/stream takes one spoken turn. The spoken turn's time
(last frame sent -> ``response.done``) is reported with and without that pressure, ``--runs`` times
each, alternating. Bounded history and linear prompt building should leave it unchanged.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time

from websockets.asyncio.client import connect

from loadgen.caller import Caller, CallerStats
from voicert.client import ClientError, load_for_streaming, server_env, stream_url


async def pressure(base: str, items: int, chars: int) -> float:
    """Seconds the Realtime session took to add its items and get its reply."""
    t0 = time.perf_counter()
    async with connect(f"{base}/v1/realtime", max_size=None) as ws:
        await ws.recv()  # session.created
        await ws.send(
            json.dumps({"type": "session.update", "session": {"output_modalities": ["text"]}})
        )
        text = ("lorem ipsum dolor sit amet " * (chars // 27 + 1))[:chars]
        for i in range(items):
            await ws.send(
                json.dumps(
                    {
                        "type": "conversation.item.create",
                        "item": {
                            "type": "message",
                            "role": "user",
                            "content": [{"type": "input_text", "text": text}],
                        },
                    }
                )
            )
            if i % 100 == 99:  # under the server's message-rate limit (200/s, bursts of 400)
                await asyncio.sleep(0.6)
        await ws.send(json.dumps({"type": "response.create"}))
        while True:
            msg = json.loads(await ws.recv())
            if msg["type"] == "response.done":
                return time.perf_counter() - t0
            if msg["type"] == "error":
                raise RuntimeError(f"the server refused: {msg['error']}")


async def spoken_turn(url: str, clip) -> float:
    stats = CallerStats()
    caller = Caller(url, [clip], turns=1, think_s=0, turn_timeout_s=120, concurrency=1, seed=0)
    await caller.session(stats, time.monotonic() + 300)
    turn = stats.turns[0]
    return turn.client_done_ms / 1000


async def run(url: str, wav: str, items: int, chars: int, runs: int) -> dict[str, list[float]]:
    base = url.split("/v1/")[0]
    clip = load_for_streaming(wav)
    out: dict[str, list[float]] = {"alone": [], "beside pressure": [], "pressure itself": []}
    for _ in range(runs):
        out["alone"].append(await spoken_turn(url, clip))
        side = asyncio.ensure_future(pressure(base, items, chars))
        out["beside pressure"].append(await spoken_turn(url, clip))
        out["pressure itself"].append(await side)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m loadgen.pressure", description=__doc__.splitlines()[0]
    )
    ap.add_argument("--url", default=server_env(), help="default: $VOICERT_URL")
    ap.add_argument("--wav", default="tests/data/capital_of_france.wav")
    ap.add_argument("--items", type=int, default=800)
    ap.add_argument("--chars", type=int, default=200)
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args(argv)
    try:
        url = stream_url(args.url)
    except ClientError as exc:
        ap.error(str(exc))
    res = asyncio.run(run(url, args.wav, args.items, args.chars, args.runs))
    print("| spoken turn, last frame -> response.done (s) | median | runs |\n|---|---:|---|")
    for name, xs in res.items():
        print(f"| {name} | {statistics.median(xs):.2f} | {', '.join(f'{x:.2f}' for x in xs)} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
