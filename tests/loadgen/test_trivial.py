"""The trivial server that validates the load generator: it recognises each clip the generator
sends and answers when the clip's last frame arrives, so every turn is answered once, after the
caller's last frame left, and what the caller measures is its own overhead."""

import glob

from websockets.asyncio.server import serve

from loadgen.run import LoadSpec, closed_loop
from loadgen.trivial import _session, clip_table
from voicert.client import load_for_streaming

CLIPS = sorted(glob.glob("tests/data/*.wav"))


def test_every_clip_is_recognised_by_its_first_sound():
    table = clip_table(CLIPS)
    assert len(table) == len(CLIPS)  # one distinct first sound each
    assert all(0 < left < 200 for left in table.values())


async def test_the_generator_measures_each_answer_after_its_last_frame():
    table = clip_table(CLIPS)
    async with serve(lambda ws: _session(ws, table), "127.0.0.1", 0) as server:
        port = server.sockets[0].getsockname()[1]
        spec = LoadSpec(
            f"ws://127.0.0.1:{port}/v1/stream",
            [load_for_streaming(c) for c in CLIPS],
            duration_s=120.0,
            ramp_s=0.2,
            turns=2,
            think_s=0.1,
            turn_timeout_s=30.0,
            max_turns=6,
        )  # ends on turns done, not on time (a busy machine is slow)
        stats = await closed_loop(spec, 3)
    assert stats.turns and not (stats.errors or stats.timeouts or stats.dropped)
    # second turns too: their audio positions follow a first clip whose last frame was short
    assert len(stats.turns) > stats.sessions
    for t in stats.turns:
        assert t.finish_reason == "stop"
        # answered on the last frame: the server's interval lies within the caller's
        assert 0 < t.stages["ttft_ms"] <= t.client_ttft_ms <= t.client_done_ms
        # the endpoint's frame, found from its audio position (vad.speech_stopped), is the
        # clip's last: the same origin as the server's, to the microsecond, in every turn
        assert abs(t.client_endpoint_ttft_ms - t.client_ttft_ms) < 0.5
        assert t.client_extra_ms >= 0


def test_the_cli_says_what_it_is_doing_and_that_plots_need_matplotlib(
    tmp_path, monkeypatch, capsys
):
    import asyncio
    import sys
    import threading

    from loadgen.__main__ import main

    table = clip_table(CLIPS)
    ready, stop, port = threading.Event(), threading.Event(), []

    async def trivial_server():
        async with serve(lambda ws: _session(ws, table), "127.0.0.1", 0) as server:
            port.append(server.sockets[0].getsockname()[1])
            ready.set()
            while not stop.is_set():
                await asyncio.sleep(0.05)

    thread = threading.Thread(target=asyncio.run, args=(trivial_server(),))
    thread.start()
    try:
        ready.wait(30)
        monkeypatch.setitem(sys.modules, "matplotlib", None)  # as on a machine without it
        code = main(
            [
                "--url",
                f"ws://127.0.0.1:{port[0]}/v1/stream",
                "--wav",
                *CLIPS,
                "--sweep",
                "1",
                "--duration",
                "1",
                "--ramp",
                "0.1",
                "--turns",
                "1",
                "--out",
                str(tmp_path),
            ]
        )
    finally:
        stop.set()
        thread.join()
    out, err = capsys.readouterr()
    assert code == 0 and "| 1 |" in out
    assert "sweep: 1 level(s) (1 sessions)" in err and "1 sessions: " in err
    assert "no plots: matplotlib is not installed" in err
    assert not list(tmp_path.glob("*.png")) and (tmp_path / "report.md").is_file()
