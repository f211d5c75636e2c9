"""The browser client at ``/`` in real headless Debian Chromium with a fake microphone fed from a
WAV: the page captures it through its AudioWorklet, streams it to ``/v1/stream``, and must show the
transcript, the streamed reply, its latency, the agent's state as the server's events move it, both
sides' audio drawn, tool calls as panels, and play the reply's speech; its event log filters and
opens each event whole; a dropped socket must show a visible reconnect."""

from __future__ import annotations

import asyncio
import base64
import json
import math
import tempfile
from pathlib import Path

import numpy as np

from tests.conftest import wav
from tests.web.browser import ARTIFACTS, Browser, pytestmark, wait_for  # noqa: F401 (pytestmark)
from voicert.audio.wav import write_wav
from voicert.server.completions import served_model_id
from voicert.telemetry.latency import STAGE_COLOURS, WATERFALL


def fake_mic_wav(directory: str, speech: bool = True) -> Path:
    """1 s of silence, the question, 5 s of silence: PCM16 mono 16 kHz, as Chromium's fake device
    reads (``speech=False``: silence only)."""
    x, rate = wav("capital_of_france")
    pad = np.zeros(rate, np.float32)
    path = Path(directory) / "mic.wav"
    write_wav(path, np.concatenate([pad, x if speech else pad, pad, pad, pad, pad, pad]), rate)
    return path


def scope_drawn(side: str) -> str:
    """JS: the side's audio scope holds bars of its colour (the last 8 s had sound)."""
    return (
        f"(() => {{ const c = document.getElementById('viz-{side}');"
        " const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;"
        " let n = 0; for (let i = 0; i < d.length; i += 4)"
        " if (d[i + 3] && d[i + 2] > 200 && d[i] > 40) n++; return n > 20; })()"
    )


async def open_client(server, speech: bool = True) -> Browser:
    """Headless Chromium whose microphone plays :func:`fake_mic_wav`, on the client page."""
    mic = fake_mic_wav(tempfile.mkdtemp(prefix="voicert-mic-"), speech)
    browser = Browser(
        (
            "--use-fake-ui-for-media-stream",
            "--use-fake-device-for-media-stream",
            f"--use-file-for-fake-audio-capture={mic}%noloop",
            "--autoplay-policy=no-user-gesture-required",
        )
    )
    try:
        await browser.open()
        await browser.call("Page.enable")
        await browser.call("Page.navigate", url=f"http://127.0.0.1:{server.port}/")
        await wait_for(browser, "document.readyState === 'complete' && !!window.voicert")
    except BaseException:
        await browser.close()
        raise
    return browser


async def test_browser_client_speaks_through_a_fake_microphone(server):
    browser = await open_client(server)
    try:
        # before Start nothing reads as broken: the page is ready, the agent idle
        assert await browser.js("document.getElementById('status').textContent") == "ready"
        assert await browser.js("document.getElementById('agent-state').dataset.state") == "idle"
        await browser.js("document.getElementById('start').click()", gesture=True)
        await wait_for(browser, "document.getElementById('status').textContent === 'live'")
        await wait_for(browser, scope_drawn("you"))  # the question, drawn as it is spoken
        user = await wait_for(
            browser,
            "[...document.querySelectorAll('.msg.user .text')].map(e => e.textContent).join(' ')",
            timeout=60,
        )
        assert "france" in user.lower()
        await wait_for(browser, scope_drawn("agent"), timeout=60)  # the reply, as it plays
        reply = await wait_for(
            browser,
            "(() => { const e = document.querySelector('.msg.agent');"
            " return e && e.dataset.done ? e.textContent : ''; })()",
            timeout=60,
        )
        assert "paris" in reply.lower()
        # the agent's state followed the server's events, in order: the moment speech ended
        # ("heard you", at vad.speech_stopped) before the transcript, then thinking, speaking,
        # and listening again once the reply has played
        await wait_for(browser, "window.voicert.agentState === 'listening'", timeout=60)
        states = [s for _, s in await browser.js("window.voicert.stateLog")]
        want = ["connecting", "listening", "hearing", "heard", "thinking", "speaking", "listening"]
        it = iter(states)
        assert all(w in it for w in want), states  # a subsequence, in order
        latency = await wait_for(
            browser,
            "document.querySelector('.lat') ? document.querySelector('.lat').textContent : ''",
        )
        assert "ttft" in latency and "ttfa" in latency
        stats = await browser.js("JSON.stringify(window.voicert.stats)")
        assert '"audioChunks":0' not in stats, stats  # the reply's speech was scheduled to play
        assert await browser.js("window.voicert.stats.framesSent") > 100  # > 2 s of mic audio sent
        # one stage-colour definition (/stages.js) behind the bars and their legend
        legend = await browser.js(
            "[...document.querySelectorAll('#legend span i')]"
            ".map(i => getComputedStyle(i).backgroundColor).join(' ')"
        )
        assert legend.count("rgb(") == len(WATERFALL)
        assert await browser.js("window.VOICERT_STAGES.colours.asr_ms") == STAGE_COLOURS["asr_ms"]
        # the event inspector saw both directions; the export holds the turn and its latency
        events = await browser.js("document.getElementById('events').textContent")
        assert "\u2191 session.start" in events and "\u2193 turn.latency" in events
        # an event opens whole (pretty JSON); the filter keeps the matching rows only
        opened = await browser.js(
            "(() => { const row = [...document.querySelectorAll('#events .ev')]"
            ".find(r => r.dataset.type === 'turn.latency'); row.click();"
            " return getComputedStyle(row.querySelector('pre')).display + '|' +"
            " row.querySelector('pre').textContent; })()"
        )
        display, whole = opened.split("|", 1)
        assert display == "block" and json.loads(whole)["type"] == "turn.latency"
        shown_rows = await browser.js(
            "(() => { const f = document.getElementById('event-filter'); f.value = 'transcript.final';"
            " f.dispatchEvent(new Event('input'));"
            " const rows = [...document.querySelectorAll('#events .ev')]"
            ".filter(r => !r.classList.contains('hidden')).map(r => r.dataset.type);"
            " f.value = ''; f.dispatchEvent(new Event('input')); return rows; })()"
        )
        assert shown_rows and set(shown_rows) == {"transcript.final"}, shown_rows
        await browser.js("document.getElementById('export').click()")
        exported = await browser.js("JSON.stringify(window.voicert.lastExport.messages)")
        assert '"role":"user"' in exported and '"role":"agent"' in exported
        assert "ttft_ms" in exported and "Paris" in exported
        prompt = server.cfg.llm.system_prompt  # the server's own: the answers stay the same
        await browser.js(
            "document.getElementById('settings').open = true;"
            "document.getElementById('inspector').open = true;"
            f"document.getElementById('system-prompt').value = {json.dumps(prompt)};"
            "document.getElementById('system-prompt').dispatchEvent(new Event('change'));"
            "document.getElementById('end-of-turn').value = 'silence';"
            "document.getElementById('silence-ms').value = '700';"
        )
        await wait_for(
            browser, "document.getElementById('events').textContent.includes('session.update')"
        )  # the prompt applies at once
        # emptied mid-session it cannot apply at once (null keeps the prompt): said, not ignored
        said = await browser.js(
            "(() => { const p = document.getElementById('system-prompt');"
            " p.value = ''; p.dispatchEvent(new Event('change'));"
            f" p.value = {json.dumps(prompt)};"
            " return document.getElementById('banner').textContent; })()"
        )
        assert "comes back with the next Start" in said
        assert await browser.js("document.getElementById('mic').options.length") >= 1
        # the server's voices and model, listed once connected; a voice picked applies at once
        offered = await browser.js(
            "[...document.getElementById('voice').options].map(o => o.value).join(',')"
        )
        assert offered.split(",") == list(server.services.tts.voices)
        assert await browser.js("document.getElementById('model').value") == served_model_id(
            server.cfg
        )
        await browser.js(
            "const v = document.getElementById('voice'); v.value = 'en-us+f3';"
            "v.dispatchEvent(new Event('change'));"
        )
        await wait_for(
            browser,
            "document.getElementById('events').textContent.includes('\"voice\":\"en-us+f3\"')",
        )
        shot = await browser.call("Page.captureScreenshot", format="png")
        ARTIFACTS.mkdir(exist_ok=True)
        (ARTIFACTS / "client.png").write_bytes(base64.b64decode(shot["data"]))

        # a dropped connection is visible and the client reconnects by itself
        await browser.js("window.voicert.ws.close(4000, 'test drop')")
        banner = await wait_for(
            browser,
            "document.getElementById('banner').classList.contains('show')"
            " && document.getElementById('banner').textContent"
            ".includes('Connection lost')"
            " && document.getElementById('banner').textContent",
        )
        assert "Reconnecting" in banner
        await wait_for(
            browser,
            "document.getElementById('status').textContent === 'live'"
            " && window.voicert.stats.reconnects === 1",
        )
        assert (
            await browser.js("document.getElementById('banner').classList.contains('show')")
            is False
        )

        # the new session carries the settings' system prompt, and asks again for the voice
        await wait_for(
            browser,
            "[...document.querySelectorAll('#events div')].filter(d => "
            "d.textContent.includes('session.update') && "
            "d.textContent.includes('en-us+f3')).length === 2",
        )
        assert await browser.js("document.getElementById('voice').value") == "en-us+f3"
        assert await browser.js(
            "[...document.querySelectorAll('#events div')].some(d => "
            "d.textContent.includes('session.start ') && "
            f"d.textContent.includes({json.dumps(prompt)}) && "
            'd.textContent.includes(\'"end_of_turn":"silence","silence_ms":700\'))'
        )
        # typing works too (a new connection is a new conversation: ask a whole question); the
        # page shows it is thinking until the first token
        assert await browser.js(
            "document.getElementById('text').value = 'What is the capital of "
            "Germany?'; document.getElementById('send').click();"
            "document.getElementById('thinking').classList.contains('show')"
        )
        await wait_for(
            browser,
            "[...document.querySelectorAll('.msg.agent')].some(e => e.dataset.done"
            " && /berlin/i.test(e.textContent))",
            timeout=60,
        )
        assert not await browser.js(
            "document.getElementById('thinking').classList.contains('show')"
        )
        await browser.js("document.getElementById('mute').click()")
        muted_at = await browser.js("window.voicert.stats.framesSent")
        await wait_for(browser, f"window.voicert.stats.framesSent > {muted_at} + 10")
        assert await browser.js("window.voicert.muted")  # silence goes on; the microphone does not
    finally:
        await browser.close()


async def test_push_to_talk_sends_only_while_held_and_commits_on_release(server):
    browser = await open_client(server)  # 1 s silence, the question, then silence
    try:
        await browser.js("document.querySelector('input[value=push-to-talk]').click()")
        await browser.js("document.getElementById('start').click()", gesture=True)
        await wait_for(browser, "document.getElementById('status').textContent === 'live'")
        assert await browser.js("window.voicert.stats.framesSent") == 0  # nothing until held
        await browser.js(
            "document.getElementById('ptt').dispatchEvent(new MouseEvent('mousedown'))"
        )
        # hold through the silence, the question and 1 s after it: counted in 20 ms frames sent,
        # not in seconds, which a busy machine stretches
        through = math.ceil((1.0 + wav("capital_of_france")[0].size / 16000 + 1.0) / 0.02)
        await wait_for(browser, f"window.voicert.stats.framesSent >= {through}", timeout=60)
        await browser.js("document.getElementById('ptt').dispatchEvent(new MouseEvent('mouseup'))")
        held_frames = await browser.js("window.voicert.stats.framesSent")
        user = await wait_for(
            browser,
            "[...document.querySelectorAll('.msg.user .text')].map(e => e.textContent).join(' ')",
            timeout=60,
        )
        assert "france" in user.lower()
        await wait_for(
            browser,
            "[...document.querySelectorAll('.msg.agent')].some(e => e.dataset.done"
            " && /paris/i.test(e.textContent))",
            timeout=60,
        )
        await asyncio.sleep(1.0)
        assert await browser.js("window.voicert.stats.framesSent") <= held_frames + 1  # released
    finally:
        await browser.close()


async def test_a_server_tool_call_and_its_output_show_in_the_reply(services):
    import dataclasses

    from voicert.agent.toolbox import Toolbox
    from voicert.config import ToolsConfig
    from voicert.server.app import VoiceServer

    tools = ToolsConfig(
        functions=["tests.agent.test_toolbox:book_table"], choice="required", parallel=False
    )  # one call, then the reply
    cfg = services.cfg
    srv = VoiceServer(
        dataclasses.replace(
            services,
            toolbox=Toolbox.from_config(tools),
            cfg=(
                dataclasses.replace(
                    cfg, tools=tools, server=dataclasses.replace(cfg.server, port=0)
                )
            ),
        )
    )
    await srv.start()
    try:
        browser = await open_client(srv, speech=False)  # a silent microphone: typed turns only
        try:
            await browser.js("document.getElementById('start').click()", gesture=True)
            await wait_for(browser, "document.getElementById('status').textContent === 'live'")
            await browser.js(
                "document.getElementById('text').value = 'Book a table for two "
                "people at eight tonight.'; document.getElementById('send').click();"
            )
            panel = await wait_for(
                browser,
                "(() => { const p = document.querySelector('.msg.agent .tool');"
                " return p && p.dataset.state === 'done' ? {"
                " name: p.querySelector('.tool-name').textContent,"
                " args: p.querySelector('.tool-args').textContent,"
                " out: p.querySelector('.tool-out').textContent } : null; })()",
                timeout=90,
            )
            assert panel["name"] == "book_table", panel
            assert json.loads(panel["args"])["people"] == 2, panel  # the decoded arguments
            assert json.loads(panel["out"])["booked"] is True, panel  # the server tool's output
            await wait_for(
                browser,
                "[...document.querySelectorAll('.msg.agent')].some(e => e.dataset.done)",
                timeout=90,
            )
            shot = await browser.call("Page.captureScreenshot", format="png")
            ARTIFACTS.mkdir(exist_ok=True)
            (ARTIFACTS / "client-tools.png").write_bytes(base64.b64decode(shot["data"]))
        finally:
            await browser.close()
    finally:
        await srv.shutdown()
