import os

from loadgen.probe import gc_figures, lag_figures, parse, step_figures
from voicert.core.llm import EngineBase, EngineStats, GcPause, StepRecord
from voicert.telemetry.metrics import Metrics


def _engine(steps):
    class Engine(EngineBase):  # the defaults, but for its steps
        submit = cancel = close = None

        def stats(self):
            return EngineStats()

        def drain_steps(self):
            return steps

    return Engine()


def test_step_figures_are_deltas_over_the_level():
    m = Metrics()
    m.sample_engine(_engine([StepRecord("decode", 8, 0.1)] * 10))  # before the level
    before = parse(m.exposition().decode())
    level = [StepRecord("decode", 2, 0.003)] * 99 + [StepRecord("decode", 2, 0.05)]
    level += [StepRecord("prefill", 1, 0.0015)] * 4
    m.sample_engine(_engine(level))
    after = parse(m.exposition().decode())
    fig = step_figures(before, after)
    assert abs(fig["decode_step_ms_mean"] - (99 * 3 + 50) / 100) < 1e-6
    assert fig["decode_step_ms_p99_le"] == 4.0  # 99 of 100 steps are <= 4 ms
    assert abs(fig["prefill_step_ms_mean"] - 1.5) < 1e-6 and fig["prefill_step_ms_p99_le"] == 2.0
    assert abs((after["engine_batch_sum"] - before["engine_batch_sum"]) - 204) < 1e-9


def test_gc_figures_per_process():
    m = Metrics()
    m.observe_gc("engine", [GcPause(2, 0.08)])  # before the level
    before = parse(m.exposition().decode())
    m.observe_gc("engine", [GcPause(0, 0.0002)] * 9 + [GcPause(2, 0.015)])
    m.observe_gc("server", [GcPause(1, 0.001)])
    fig = gc_figures(before, parse(m.exposition().decode()))
    assert fig["gc_engine_count"] == 10 and abs(fig["gc_engine_ms_total"] - 16.8) < 1e-6
    assert fig["gc_engine_ms_max_le"] == 20.0  # the 15 ms full collection
    assert fig["gc_server_count"] == 1 and fig["gc_server_ms_max_le"] == 1.0


def test_loop_lag_figures_are_the_levels_own():
    m = Metrics()
    lag = m.loop_lag.labels("server")
    lag.observe(0.4)  # before the level: not the level's
    before = parse(m.exposition().decode())
    for _ in range(99):
        lag.observe(0.0008)
    lag.observe(0.03)
    fig = lag_figures(before, parse(m.exposition().decode()))
    assert fig["loop_lag_server_ms_p99_le"] == 1.0  # 99 of 100 waits were <= 1 ms
    assert fig["loop_lag_server_ms_max_le"] == 50.0  # the 30 ms one, not the 400 ms before
    assert lag_figures(before, before) == {}


def test_cpu_of_a_server_counts_its_descendants_and_nothing_else(tmp_path):
    from loadgen.probe import tree_cpu_seconds

    tick = os.sysconf("SC_CLK_TCK")

    def proc(pid, ppid, utime, stime, comm="python3 (x)"):
        d = tmp_path / str(pid)
        d.mkdir()
        rest = ["S", str(ppid)] + ["0"] * 9 + [str(utime), str(stime)] + ["0"] * 10
        (d / "stat").write_text(f"{pid} ({comm}) " + " ".join(rest) + "\n")

    proc(10, 1, 2 * tick, tick)  # the primary
    proc(11, 10, 5 * tick, 0)  # a worker (its name has a ") " in it, as names may)
    proc(12, 11, tick, tick, comm="odd) name")  # its child
    proc(20, 1, 100 * tick, 0)  # someone else
    (tmp_path / "self").mkdir()
    assert tree_cpu_seconds(10, str(tmp_path)) == 10.0
    assert tree_cpu_seconds(11, str(tmp_path)) == 7.0
    assert tree_cpu_seconds(99, str(tmp_path)) is None
