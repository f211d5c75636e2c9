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
    for name in ("ttft_cdf", "stages_by_concurrency"):
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
