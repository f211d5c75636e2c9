from prometheus_client.parser import text_string_to_metric_families

from voicert.core.llm import EngineBase, EngineStats, StepRecord
from voicert.telemetry.latency import WATERFALL, Point, TurnRecord, TurnTrace
from voicert.telemetry.metrics import Metrics, latency_buckets

ORDER = (
    Point.VOICE_END,
    Point.ENDPOINT,
    Point.TRANSCRIPT,
    Point.SUBMIT,
    Point.PREFILL_START,
    Point.FIRST_TOKEN_SAMPLED,
    Point.FIRST_TOKEN_RECEIVED,
    Point.FIRST_TOKEN_SENT,
    Point.DONE,
)


def trace_with(ms_between_points: list[float]) -> TurnTrace:
    """Marks the main points in order with the given gaps (ASR start/done left out)."""
    t = TurnTrace(3)
    now = 0
    for point, gap in zip(ORDER, [0.0, *ms_between_points]):
        now += int(gap * 1e6)
        t.mark(point, now)
    t.mark(Point.ENDPOINT_AUDIO, t.points[Point.ENDPOINT])  # handled as it came: no ingest lag
    return t


def test_buckets_step_one_ms_around_the_budget():
    b = [round(x * 1000, 3) for x in latency_buckets(100)]
    assert all(m in b for m in range(90, 111))
    assert b == sorted(b) and b[0] < 1 and b[-1] >= 10000


def test_turn_record_names_the_dominant_stage_and_the_budget_breach():
    # VOICE_END -> ENDPOINT 400, -> TRANSCRIPT 30, -> SUBMIT 1, -> PREFILL_START 2, -> SAMPLED 80,
    # -> RECEIVED 1, -> SENT 1, -> DONE 50
    rec = TurnRecord.from_trace(trace_with([400, 30, 1, 2, 80, 1, 1, 50]), "s", "stop", 5, 100)
    assert rec.dominant_stage == "endpoint_ms"
    assert rec.ttft_ms == 115.0 and rec.over_budget
    assert sum(rec.stages[k] for k in WATERFALL) == rec.stages["voice_to_first_token_ms"]
    ok = TurnRecord.from_trace(trace_with([400, 30, 1, 2, 20, 1, 1, 50]), "s", "stop", 5, 100)
    assert not ok.over_budget and ok.ttft_ms == 55.0


def test_exposition_carries_turns_errors_and_engine_figures():
    m = Metrics(budget_ms=100)
    m.observe_turn(
        TurnRecord.from_trace(trace_with([400, 30, 1, 2, 80, 1, 1, 50]), "s", "stop", 5, 100)
    )
    m.observe_error("bad_audio")
    m.observe_error("bad_audio")
    m.session_started()

    class Engine(EngineBase):  # the defaults, but for its counters and steps
        submit = cancel = close = None

        def stats(self):
            return EngineStats(2, extra={"prefix_hit_ratio": 0.75, "spec_acceptance_rate": 0.5})

        def drain_steps(self):
            return [
                StepRecord("prefill", 1, 0.003),
                StepRecord("decode", 4, 0.0015),
                StepRecord("decode", 4, 0.0025),
            ]

    m.sample_engine(Engine())
    fams = {f.name: f for f in text_string_to_metric_families(m.exposition().decode())}
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value for f in fams.values() for s in f.samples
    }
    assert samples[("voicert_ttft_seconds_count", ())] == 1
    assert samples[("voicert_turns_over_budget_total", ())] == 1
    assert samples[("voicert_errors_total", (("code", "bad_audio"),))] == 2
    assert samples[("voicert_stage_latency_seconds_count", (("stage", "asr"),))] == 1
    assert samples[("voicert_engine_batch_size_count", ())] == 3
    assert samples[("voicert_engine_batch_size_sum", ())] == 9
    assert samples[("voicert_engine_step_seconds_count", (("kind", "decode"),))] == 2
    assert samples[("voicert_engine_step_seconds_sum", (("kind", "prefill"),))] == 0.003
    assert samples[("voicert_prefix_cache_hit_ratio", ())] == 0.75
    assert samples[("voicert_active_sessions", ())] == 1
    assert samples[("voicert_engine_running", ())] == 2


def test_listeners_get_turns_and_a_broken_one_is_contained():
    m = Metrics()
    got = []
    m.listeners.add(got.append)
    m.listeners.add(lambda rec: 1 / 0)
    rec = TurnRecord.from_trace(trace_with([1, 1, 1, 1, 1, 1, 1, 1]), "s", "stop", 1, 100)
    m.observe_turn(rec)
    assert got == [rec] and list(m.recent) == [rec]
