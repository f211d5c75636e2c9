"""Headless Debian Chromium driven over the DevTools protocol, for the browser tests."""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest
from websockets.asyncio.client import connect

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
ARTIFACTS = Path(__file__).resolve().parents[2] / "artifacts"
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="Debian chromium is not installed")


class Browser:
    """Headless Chromium with a DevTools endpoint on loopback; one page."""

    def __init__(self, extra_flags: tuple[str, ...] = ()) -> None:
        self.profile = tempfile.mkdtemp(prefix="voicert-chromium-")
        self.proc = subprocess.Popen(
            [
                CHROMIUM,
                "--headless=new",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-quic",
                "--no-first-run",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--remote-debugging-address=127.0.0.1",
                "--remote-debugging-port=0",
                f"--user-data-dir={self.profile}",
                "--window-size=1400,1000",
                *extra_flags,
                "about:blank",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        self.ws = None
        self._id = 0

    async def open(self) -> None:
        port_file = Path(self.profile) / "DevToolsActivePort"
        for _ in range(200):
            if port_file.exists() and port_file.read_text().strip():
                break
            await asyncio.sleep(0.05)
        port = int(port_file.read_text().split()[0])
        targets = json.loads(
            await asyncio.to_thread(
                lambda: urllib.request.urlopen(
                    f"http://127.0.0.1:{port}/json/list", timeout=5
                ).read()
            )
        )
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

    async def js(self, expr: str, gesture: bool = False):
        """Evaluate ``expr`` in the page; ``gesture``: as if the user clicked (media, autoplay)."""
        result = await self.call(
            "Runtime.evaluate",
            expression=expr,
            returnByValue=True,
            awaitPromise=True,
            userGesture=gesture,
        )
        return result["result"].get("value")

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
