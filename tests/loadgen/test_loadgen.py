"""The load generator against the real server: closed loop, open loop, sweep, and its reports."""

import json

from loadgen.__main__ import by_concurrency
from loadgen.report import write_all
from loadgen.run import LoadSpec, closed_loop, open_loop, sweep
from tests.conftest import wav
from voicert.protocol import native as p


def spec(url, **kw):
    base = dict(duration_s=4.0, ramp_s=0.5, turns=1, think_s=0.2, turn_timeout_s=60.0)
    base.update(kw)
    return LoadSpec(url, [wav("capital_of_france"), wav("what_about_germany")], **base)


async def test_closed_loop_measures_client_and_server_latency(url, tmp_path):
    stats = await closed_loop(spec(url), 2)
    assert stats.turns and not (stats.errors or stats.timeouts or stats.dropped)
    for t in stats.turns:
        assert t.concurrency == 2 and t.finish_reason in ("stop", "length")
        assert t.client_ttfa_ms is None  # no speech asked for
        assert t.stages["ttft_ms"] > 0
        # the caller waits through the endpointer's silence; its view includes the server's TTFT
        assert t.client_ttft_ms > t.stages["ttft_ms"]
        assert t.client_done_ms >= t.client_ttft_ms
    files = write_all({2: stats}, tmp_path, 100.0, None, "test", {"argv": []})
    doc = json.loads(files["json"].read_text())
    assert doc["levels"]["2"]["stages"]["ttft_ms"]["n"] == len(stats.turns)
    md = files["markdown"].read_text()
    assert "| 2 |" in md and "ttft_ms" in md and "client_ttft_ms" in md
    assert "client_v2ft_ms" in md and doc["levels"]["2"]["refused"] == 0
    for t in stats.turns:  # the callers' own voice-to-first-token, from their clip's last word
        assert t.client_v2ft_ms > 0 and t.stages["voice_to_first_token_ms"] > 0
    for name in ("v2ft_cdf", "stages_by_concurrency"):
        assert files[name].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


async def test_spoken_replies_measure_time_to_first_audio(url):
    stats = await closed_loop(spec(url, output_audio=p.OutputAudio("pcm16", 24000)), 1)
    assert stats.turns and not stats.errors
    for t in stats.turns:
        assert t.client_ttfa_ms > t.client_ttft_ms and t.stages["ttfa_ms"] > 0


async def test_callers_split_over_processes(url):
    stats = await closed_loop(spec(url, procs=2), 2)
    assert stats.turns and not (stats.errors or stats.timeouts or stats.dropped)
    assert stats.sessions >= 2 and all(t.concurrency == 2 for t in stats.turns)
    assert all(t.stages["ttft_ms"] > 0 and t.client_ttft_ms > 0 for t in stats.turns)


async def test_open_loop_groups_turns_by_open_sessions(url):
    stats = await open_loop(spec(url, duration_s=2.0), sessions_per_s=1.5)
    assert stats.sessions >= 1 and stats.turns
    levels = by_concurrency(stats)
    assert sum(len(s.turns) for s in levels.values()) == len(stats.turns)
    assert all(t.concurrency == n for n, s in levels.items() for t in s.turns)


async def test_sweep_reports_the_largest_level_within_budget(url, tmp_path):
    # the generator shares this test process (and its busy cores) with the server: its own
    # schedule slip is checked in the test below, not here
    levels, best = await sweep(
        spec(url, duration_s=1.0), [1], budget_ms=60_000, max_slip_ms=float("inf")
    )
    assert best == 1 and levels[1].slip.n > 0
    server = levels[1].server  # from the server's /metrics over the level
    assert server["engine_batch_mean"] >= 1 and server["asr_batch_mean"] >= 1
    assert 0 <= server["prefix_hit_ratio"] <= 1
    md = write_all(levels, tmp_path, 60_000, best, "t", {})["markdown"].read_text()
    assert "engine_batch_mean" in md and "Dominant waterfall stage at P99: 1 sessions:" in md
    assert "| 1 | yes |" in md
    _, none = await sweep(spec(url, duration_s=1.0), [1], budget_ms=0.001, max_slip_ms=float("inf"))
    assert none is None


def test_a_level_whose_generator_fell_behind_is_marked_invalid(tmp_path):
    from loadgen.caller import CallerStats, SlipHistogram, TurnSample

    on_time, late = CallerStats(), CallerStats()
    for stats, slip in ((on_time, 0.4), (late, 35.0)):
        stats.turns.append(TurnSample(1, stages={"ttft_ms": 5.0}))
        for _ in range(100):
            stats.slip.add(slip)
    merged = CallerStats()
    merged.merge(on_time)
    merged.merge(late)
    assert merged.slip.n == 200 and merged.slip.percentile(50) == 0.5
    assert merged.slip.percentile(99) == 35.1 and SlipHistogram().percentile(99) == 0.0
    md = write_all({1: on_time, 2: late}, tmp_path, 100.0, 1, "t", {})["markdown"].read_text()
    assert "1 sessions: P99 0.5 ms," in md and "2 sessions: P99 35.1 ms INVALID" in md
    assert "| ttft_ms | 5.0 | 5.0 | 5.0* |" in md and "fewer than 100 turns" in md


def test_a_sweep_cut_short_keeps_the_levels_it_finished_on_disk(tmp_path):
    import json

    from loadgen.caller import CallerStats, TurnSample
    from loadgen.report import LevelWriter

    writer = LevelWriter(tmp_path, 100.0, "t", {"argv": ["--sweep", "1,2,4"]})
    for n, ttft, held in ((1, 5.0, True), (2, 500.0, False)):
        stats = CallerStats()
        stats.turns.append(TurnSample(n, stages={"ttft_ms": ttft}))
        writer.add(n, stats, held)
        saved = json.loads((tmp_path / "result.json").read_text())
        assert sorted(saved["levels"]) == [str(k) for k in range(1, n + 1)]
        assert saved["meta"]["partial"] is True and saved["largest_holding_budget"] == 1
        assert f"| {n} | 1 |" in (tmp_path / "report.md").read_text()


def test_an_endpoint_is_timed_from_the_frame_that_completed_its_window():
    from loadgen.caller import deciding_frame

    # 20 ms frames of 320 samples at 16 kHz; VAD windows of 32 ms: a window ending at 32 ms
    # needs frame 1 (20-40 ms) whole
    ends = [320 * (i + 1) for i in range(50)]
    assert [deciding_frame(ends, ms, 16000) for ms in (20, 32, 40, 64, 416, 800)] == [
        0,
        1,
        1,
        3,
        20,
        39,
    ]
    for k in range(1, 30):  # every window end lies in the frame holding its last sample
        frame = deciding_frame(ends, 32 * k, 16000)
        assert ends[frame] - 320 < 32 * k * 16 <= ends[frame]
    # a clip's last frame was short (100 samples): every later frame ends 220 samples earlier
    # than 20 ms frame counting says, and a window is found by samples, not by frame count
    ends = [320, 640, 740] + [740 + 320 * (i + 1) for i in range(20)]
    assert deciding_frame(ends, 64, 16000) == 3  # 1024 samples: in the frame 740-1060
    assert deciding_frame(ends, 416, 16000) == 21  # 6656 samples: in the frame 6500-6820
    assert deciding_frame(ends, 448, 16000) == len(ends)  # not yet sent
    # at 8 kHz (160-sample frames) the same windows, in the client's samples
    ends8 = [160 * (i + 1) for i in range(50)]
    assert deciding_frame(ends8, 32, 8000) == 1 and deciding_frame(ends8, 40, 8000) == 1


def level(ttft: float = 5.0, server_v2ft: float = 400.0, client_v2ft: float = 420.0, **counts):
    from loadgen.caller import CallerStats, TurnSample

    stats = CallerStats(**counts)
    stages = {"ttft_ms": ttft, "voice_to_first_token_ms": server_v2ft}
    stats.turns.append(TurnSample(1, stages=stages, client_v2ft_ms=client_v2ft))
    return stats


def test_refusals_timeouts_and_lost_sessions_never_hold_the_budget(tmp_path):
    from loadgen.report import misses

    assert misses(level(), 100.0) == []
    for name in ("refused", "unreachable", "dropped", "errors", "timeouts"):
        assert misses(level(**{name: 3}), 100.0) == [f"3 {name}"]
    files = write_all({512: level(refused=11, sessions=12)}, tmp_path, 100.0, None, "t", {})
    doc = json.loads(files["json"].read_text())
    assert doc["levels"]["512"]["refused"] == 11 and doc["levels"]["512"]["holds"] is False
    assert "| 512 | no: 11 refused | 12 | 11 | 0 |" in files["markdown"].read_text()


def test_a_server_whose_clock_disagrees_with_the_callers_does_not_hold():
    from loadgen.report import misses

    # within max(60 ms, 15 %) of the callers' P50: agrees
    assert misses(level(server_v2ft=400.0, client_v2ft=455.0), 100.0) == []
    assert misses(level(server_v2ft=1800.0, client_v2ft=2088.0), 100.0) == []
    (why,) = misses(level(server_v2ft=449.0, client_v2ft=2088.0), 100.0)
    assert why == "server V2FT P50 449 ms against the callers' 2088"


def test_a_run_with_no_turns_says_so_in_one_line(tmp_path, capsys):
    import socket

    from loadgen.__main__ import main

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    argv = ["--url", f"ws://127.0.0.1:{port}", "--callers", "1", "--duration", "0.3"]
    argv += ["--ramp", "0", "--budget-ms", "100", "--out", str(tmp_path)]
    argv += ["--wav", "tests/data/capital_of_france.wav"]
    assert main(argv) == 1
    (line,) = capsys.readouterr().out.strip().splitlines()
    assert line.startswith("No turn completed: ") and " unreachable" in line
    assert not list(tmp_path.glob("*.png"))  # no empty plots


async def test_a_session_refused_at_the_door_is_counted_as_refused():
    import http

    from websockets.asyncio.server import serve

    from loadgen.caller import Caller, CallerStats

    def busy(connection, request):
        return connection.respond(http.HTTPStatus.SERVICE_UNAVAILABLE, "at capacity\n")

    async with serve(lambda ws: None, "127.0.0.1", 0, process_request=busy) as server:
        port = server.sockets[0].getsockname()[1]
        clip = wav("capital_of_france")
        caller = Caller(
            f"ws://127.0.0.1:{port}",
            [clip],
            turns=1,
            think_s=0,
            turn_timeout_s=5,
            concurrency=1,
            seed=0,
            voice_ends=[1],
        )
        stats = CallerStats()
        await caller.session(stats, stop_at=float("inf"))
    assert (stats.sessions, stats.refused, stats.unreachable) == (1, 1, 0)


def test_a_clips_voice_ends_at_its_last_word_not_at_its_end():
    import numpy as np

    from loadgen.caller import voice_end

    x, rate = wav("capital_of_france")
    padded = np.concatenate([x, np.zeros(rate, np.float32)])  # a second of silence after
    end = voice_end(padded, rate)
    assert 0 < end <= x.size + rate // 10
    assert voice_end(np.zeros(rate, np.float32), rate) == 0
