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


def painted(canvas: str) -> str:
    """JS: how many of the canvas's pixels are coloured (not grey, not empty)."""
    return (
        f"(() => {{ const c = document.getElementById('{canvas}');"
        " const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;"
        " let n = 0; for (let i = 0; i < d.length; i += 4)"
        " if (d[i + 3] && (d[i] !== d[i + 1] || d[i + 1] !== d[i + 2])) n++; return n; })()"
    )


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
        assert await browser.js(painted("waterfall")) > 500
        assert "ttft_ms" in await browser.js("document.getElementById('last').textContent")
        # rows are labelled by what the caller said; the colours are the client's (/stages.js)
        said = await browser.js("state.turns.map(t => t.said).join(' | ')")
        assert "germany" in said.lower()
        assert await browser.js("colour('prefill_ms')") == STAGE_COLOURS["prefill_ms"]
        await wait_for(browser, "document.getElementById('sessions').textContent !== ''")
        # the turns over time, on a clock axis
        assert await browser.js(painted("timeline")) > 100
        # the budget is the server's until one is set on the page; set, it recounts the turns
        # over it and is kept in this browser
        assert (
            await browser.js("Number(document.getElementById('budget-input').value)")
            == server.cfg.telemetry.budget_ms
        )
        over = await browser.js(
            "(() => { const b = document.getElementById('budget-input');"
            " const at = v => { b.value = String(v); b.dispatchEvent(new Event('change'));"
            " return Number(document.getElementById('over').textContent); };"
            " return [at(100000), at(1), state.turns.filter(t => t.ttft_ms > 1).length,"
            " localStorage.getItem('voicert.dashboard.budget')]; })()"
        )
        assert over[0] == 0 and over[1] == over[2] and over[3] == "1", over
        # drill-down: a session's row shows only its turns, everywhere
        sid = await browser.js("state.turns[0].session_id")
        picked = await browser.js(
            f"(() => {{ document.querySelector('#session-table tr[data-session=\"{sid}\"]').click();"
            " return [shown().length, shown().every(t => t.session_id === state.session),"
            " document.querySelector('#session-table tr.picked').dataset.session,"
            " document.getElementById('session-filter').value,"
            " document.getElementById('last-label').textContent]; })()"
        )
        assert picked[0] >= 1 and picked[1] and picked[2] == sid and picked[3] == sid, picked
        assert sid[:12] in picked[4]
        await browser.js(
            "document.querySelector('#session-table tr[data-session=\"\"]').click();"
            "const b = document.getElementById('budget-input'); b.value = '';"
            " b.dispatchEvent(new Event('change'))"
        )  # all sessions, the server's budget: the screenshot shows every turn
        assert await browser.js("state.session") == ""
        assert await browser.js("state.budget") == server.cfg.telemetry.budget_ms
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
        assert snap["type"] == "snapshot" and snap["budget_ms"] == server.cfg.telemetry.budget_ms
        assert snap["waterfall"][0] == "endpoint_ms"
        # a sample reaches the feed: ticked here, not awaited from the clock (a busy machine
        # may delay the sampler's own ticks by any amount; their timing is test_sampler's)
        server.sampler.tick()
        tick = json.loads(await ws.recv())
        assert tick["type"] in ("system", "turn")


MARKUP = '"><img src=x onerror="window.pwned=1"><script>window.pwned=2</script>'


async def test_every_string_of_the_feed_reaches_the_page_as_text(services):
    """A phone call's ids, the caller's words and the stage names travel into the operator's
    page: markup in any of them is shown as text, never run (stored XSS)."""
    import time

    from tests.conftest import server_with
    from voicert.telemetry.latency import TurnRecord

    srv = await server_with(services)
    browser = Browser()
    try:
        stages = {"endpoint_ms": 400.0, "ttft_ms": 20.0, f"x{MARKUP}_ms": 3.0}
        srv.services.metrics.observe_turn(
            TurnRecord(
                f"twilio-{MARKUP}",
                1,
                time.time(),
                stages,
                f"stop{MARKUP}",
                5,
                100.0,
                20.0,
                f"endpoint{MARKUP}",
                False,
                f"hello {MARKUP}",
            )
        )
        await browser.open()
        await browser.call("Page.enable")
        await browser.call("Page.navigate", url=f"http://127.0.0.1:{srv.port}/dashboard")
        await wait_for(browser, "document.getElementById('status').textContent === 'live'")
        await wait_for(browser, "Number(document.getElementById('turn-count').dataset.turns) >= 1")
        await browser.js(  # the session's row, so that every table shows it
            "document.querySelector('#session-table tr[data-session]:not([data-session=\"\"])')"
            ".click()"
        )
        seen = await browser.js(
            "[window.pwned === undefined, document.querySelectorAll('img, script:not([src])')"
            ".length, document.getElementById('session-table').textContent,"
            " document.getElementById('last').textContent,"
            " document.getElementById('last-label').textContent,"
            " document.getElementById('session-filter').textContent]"
        )
        assert seen[0] and seen[1] == 0, seen
        assert "hello" in seen[2] and "<img" in seen[3] and "<img" in seen[4], seen
        shot = await browser.call("Page.captureScreenshot", format="png")
        ARTIFACTS.mkdir(exist_ok=True)
        (ARTIFACTS / "dashboard-markup.png").write_bytes(base64.b64decode(shot["data"]))
    finally:
        await browser.close()
        await srv.shutdown()


async def test_the_pages_send_a_strict_csp_and_break_none_of_it(server):
    """Both pages: a CSP with no 'unsafe-inline', no framing, nosniff; and in Chromium, loading
    each page (its styles, scripts, the worklet's module) violates none of it."""
    for path in ("/", "/dashboard"):
        with await asyncio.to_thread(
            urllib.request.urlopen, f"http://127.0.0.1:{server.port}{path}"
        ) as r:
            csp = r.headers["Content-Security-Policy"]
            assert "unsafe-inline" not in csp and "frame-ancestors 'none'" in csp
            assert "script-src 'self'" in csp and "style-src 'self'" in csp
            assert r.headers["X-Content-Type-Options"] == "nosniff"
            assert r.headers["X-Frame-Options"] == "DENY"
    browser = Browser()
    try:
        await browser.open()
        await browser.call("Page.enable")
        await browser.call(
            "Page.addScriptToEvaluateOnNewDocument",
            source="window.cspViolations = []; document.addEventListener("
            "'securitypolicyviolation', e => window.cspViolations.push(e.violatedDirective + ' '"
            " + e.blockedURI));",
        )
        for path, ready in (
            ("/dashboard", "document.getElementById('status').textContent === 'live'"),
            ("/", "document.readyState === 'complete' && !!document.getElementById('legend')"),
        ):
            await browser.call("Page.navigate", url=f"http://127.0.0.1:{server.port}{path}")
            await wait_for(browser, ready)
            styled = await browser.js(  # the stylesheet applied: the page is not unstyled
                "getComputedStyle(document.body).margin !== '8px'"
            )
            assert styled, path
            assert await browser.js("window.cspViolations") == [], path
    finally:
        await browser.close()
