"""The dashboard in real headless Debian Chromium (driven over the DevTools protocol), during real
turns: the page must show the turns and draw them. The screenshot is kept as a test artifact."""

from __future__ import annotations

import asyncio
import base64
import json
import shutil
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest
from websockets.asyncio.client import connect

from tests.conftest import wav
from voicert.client import stream_audio

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
ARTIFACTS = Path(__file__).resolve().parents[2] / "artifacts"
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="Debian chromium is not installed")


class Browser:
    """Headless Chromium with a DevTools endpoint on loopback; one page."""

    def __init__(self) -> None:
        self.profile = tempfile.mkdtemp(prefix="voicert-chromium-")
        self.proc = subprocess.Popen(
            [CHROMIUM, "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic",
             "--no-first-run", "--disable-background-networking", "--disable-component-update",
             "--disable-sync", "--remote-debugging-address=127.0.0.1",
             "--remote-debugging-port=0", f"--user-data-dir={self.profile}",
             "--window-size=1400,1000", "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.ws = None
        self._id = 0

    async def open(self) -> None:
        port_file = Path(self.profile) / "DevToolsActivePort"
        for _ in range(200):
            if port_file.exists() and port_file.read_text().strip():
                break
            await asyncio.sleep(0.05)
        port = int(port_file.read_text().split()[0])
        targets = json.loads(await asyncio.to_thread(
            lambda: urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=5).read()))
        page = next(t for t in targets if t["type"] == "page")
        self.ws = await connect(page["webSocketDebuggerUrl"], max_size=None)

    async def call(self, method: str, **params):
        self._id += 1
        await self.ws.send(json.dumps({"id": self._id, "method": method, "params": params}))
        while True:
            msg = json.loads(await asyncio.wait_for(self.ws.recv(), 30))
            if msg.get("id") == self._id:
                if "error" in msg:
                    raise RuntimeError(msg["error"])
                return msg["result"]

    async def js(self, expr: str):
        return (await self.call("Runtime.evaluate", expression=expr, returnByValue=True))["result"].get("value")

    async def close(self) -> None:
        if self.ws is not None:
            await self.ws.close()
        self.proc.terminate()
        self.proc.wait(10)
        shutil.rmtree(self.profile, ignore_errors=True)


async def wait_for(browser: Browser, expr: str, timeout: float = 30.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = await browser.js(expr)
        if value:
            return value
        await asyncio.sleep(0.2)
    raise AssertionError(f"timed out waiting for {expr}")


async def test_dashboard_shows_real_turns_live(server, url):
    await stream_audio(url, [wav("capital_of_france")], realtime=False)  # in the snapshot
    browser = Browser()
    try:
        await browser.open()
        await browser.call("Page.enable")
        await browser.call("Page.navigate", url=f"http://127.0.0.1:{server.port}/dashboard")
        await wait_for(browser, "document.getElementById('status').textContent === 'live'")
        before = int(await wait_for(browser, "Number(document.getElementById('turn-count').dataset.turns)"))
        assert before >= 1
        await stream_audio(url, [wav("what_about_germany")], realtime=False)  # pushed live
        after = await wait_for(
            browser, f"Number(document.getElementById('turn-count').dataset.turns) > {before} && "
                     "Number(document.getElementById('turn-count').dataset.turns)")
        assert after == before + 1
        # the charts drew the turns: the waterfall canvas has coloured pixels, the table the stages
        painted = await browser.js(
            "(() => { const c = document.getElementById('waterfall');"
            " const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;"
            " let n = 0; for (let i = 0; i < d.length; i += 4) if (d[i + 3] && (d[i] !== d[i + 1] || d[i + 1] !== d[i + 2])) n++;"
            " return n; })()")
        assert painted > 500
        assert "ttft_ms" in await browser.js("document.getElementById('last').textContent")
        await wait_for(browser, "document.getElementById('sessions').textContent !== ''")
        shot = await browser.call("Page.captureScreenshot", format="png")
        ARTIFACTS.mkdir(exist_ok=True)
        (ARTIFACTS / "dashboard.png").write_bytes(base64.b64decode(shot["data"]))
    finally:
        await browser.close()


async def test_dashboard_static_files_and_feed_snapshot(server):
    body = await asyncio.to_thread(
        lambda: urllib.request.urlopen(f"http://127.0.0.1:{server.port}/dashboard", timeout=5).read())
    assert b"<canvas" in body and b"/dashboard.js" in body
    async with connect(f"ws://127.0.0.1:{server.port}/v1/dashboard") as ws:
        snap = json.loads(await ws.recv())
        assert snap["type"] == "snapshot" and snap["budget_ms"] == 100.0
        assert snap["waterfall"][0] == "endpoint_ms"
        tick = json.loads(await asyncio.wait_for(ws.recv(), 5))
        assert tick["type"] in ("system", "turn")
