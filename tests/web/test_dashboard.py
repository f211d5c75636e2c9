"""The dashboard in real headless Debian Chromium (driven over the DevTools protocol), during real
turns: the page must show the turns and draw them. The screenshot is kept as a test artifact."""

from __future__ import annotations

import asyncio
import base64
import json
import urllib.request

from websockets.asyncio.client import connect

from tests.conftest import wav
from tests.web.browser import ARTIFACTS, Browser, pytestmark, wait_for  # noqa: F401 (pytestmark)
from voicert.client import stream_audio
from voicert.telemetry.latency import STAGE_COLOURS


async def test_dashboard_shows_real_turns_live(server, url):
    await stream_audio(url, [wav("capital_of_france")], realtime=False)  # in the snapshot
    browser = Browser()
    try:
        await browser.open()
        await browser.call("Page.enable")
        await browser.call("Page.navigate", url=f"http://127.0.0.1:{server.port}/dashboard")
        await wait_for(browser, "document.getElementById('status').textContent === 'live'")
        before = int(
            await wait_for(browser, "Number(document.getElementById('turn-count').dataset.turns)")
        )
        assert before >= 1
        await stream_audio(url, [wav("what_about_germany")], realtime=False)  # pushed live
        after = await wait_for(
            browser,
            f"Number(document.getElementById('turn-count').dataset.turns) > {before} && "
            "Number(document.getElementById('turn-count').dataset.turns)",
        )
        assert after == before + 1
        # the charts drew the turns: the waterfall canvas has coloured pixels, the table the stages
        painted = await browser.js(
            "(() => { const c = document.getElementById('waterfall');"
            " const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;"
            " let n = 0; for (let i = 0; i < d.length; i += 4) if (d[i + 3] && (d[i] !== d[i + 1] || d[i + 1] !== d[i + 2])) n++;"
            " return n; })()"
        )
        assert painted > 500
        assert "ttft_ms" in await browser.js("document.getElementById('last').textContent")
        # rows are labelled by what the caller said; the colours are the client's (/stages.js)
        said = await browser.js("state.turns.map(t => t.said).join(' | ')")
        assert "germany" in said.lower()
        assert await browser.js("colour('prefill_ms')") == STAGE_COLOURS["prefill_ms"]
        await wait_for(browser, "document.getElementById('sessions').textContent !== ''")
        shot = await browser.call("Page.captureScreenshot", format="png")
        ARTIFACTS.mkdir(exist_ok=True)
        (ARTIFACTS / "dashboard.png").write_bytes(base64.b64decode(shot["data"]))
    finally:
        await browser.close()


async def test_dashboard_static_files_and_feed_snapshot(server):
    body = await asyncio.to_thread(
        lambda: urllib.request.urlopen(
            f"http://127.0.0.1:{server.port}/dashboard", timeout=5
        ).read()
    )
    assert b"<canvas" in body and b"/dashboard.js" in body
    async with connect(f"ws://127.0.0.1:{server.port}/v1/dashboard") as ws:
        snap = json.loads(await ws.recv())
        assert snap["type"] == "snapshot" and snap["budget_ms"] == 100.0
        assert snap["waterfall"][0] == "endpoint_ms"
        tick = json.loads(await asyncio.wait_for(ws.recv(), 5))
        assert tick["type"] in ("system", "turn")
