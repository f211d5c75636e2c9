"""OpenTelemetry turn spans, read back from the SDK's in-memory exporter: one span per turn with
the GenAI attributes, a child per stage that ran forwards with the stage's own duration, stages
that ran backwards as attributes; a session with spans on writes each finished turn."""

from __future__ import annotations

import dataclasses

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from voicert.telemetry.latency import Point, TurnRecord, TurnTrace
from voicert.telemetry.tracing import TurnSpans, build_spans

MS = 1_000_000


@pytest.fixture
def exported():
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return TurnSpans(provider.get_tracer("test"), "SmolLM2"), exporter


def test_a_turn_is_a_span_with_a_child_per_stage(exported):
    spans, exporter = exported
    trace = TurnTrace(3)
    t0 = 10_000 * MS
    for point, at in [
        (Point.VOICE_END, 0),
        (Point.ASR_START, 100),  # early decode: before the endpoint
        (Point.ASR_DONE, 300),
        (Point.ENDPOINT_AUDIO, 400),
        (Point.ENDPOINT, 400),
        (Point.TRANSCRIPT, 401),
        (Point.SUBMIT, 250),  # a reply started ahead: dispatch runs backwards
        (Point.PREFILL_START, 260),
        (Point.FIRST_TOKEN_SAMPLED, 330),
        (Point.FIRST_TOKEN_RECEIVED, 402),
        (Point.FIRST_TOKEN_SENT, 403),
        (Point.DONE, 900),
    ]:
        trace.mark(point, t0 + at * MS)
    record = TurnRecord.from_trace(trace, "s1", "stop", 17, 100.0)
    spans.turn(trace, record, prompt_tokens=42)
    finished = exporter.get_finished_spans()
    (turn,) = [s for s in finished if s.name == "voice turn"]
    children = {s.name: s for s in finished if s.parent is not None}
    assert all(s.parent.span_id == turn.context.span_id for s in children.values())
    assert (turn.end_time - turn.start_time) == 900 * MS
    assert (children["endpoint"].end_time - children["endpoint"].start_time) == 400 * MS
    assert (children["asr_decode"].end_time - children["asr_decode"].start_time) == 200 * MS
    assert children["prefill"].start_time - turn.start_time == 260 * MS
    assert "dispatch" not in children and turn.attributes["voicert.stage.dispatch_ms"] == -151.0
    attrs = turn.attributes
    assert attrs["gen_ai.operation.name"] == "chat" and attrs["gen_ai.request.model"] == "SmolLM2"
    assert attrs["gen_ai.usage.input_tokens"] == 42 and attrs["gen_ai.usage.output_tokens"] == 17
    assert attrs["gen_ai.response.finish_reasons"] == ("stop",)
    assert (attrs["voicert.session.id"], attrs["voicert.turn.id"]) == ("s1", 3)
    assert attrs["voicert.ttft_ms"] == 3.0


def test_no_endpoint_no_spans():
    assert build_spans("", "voicert", "m") is None


async def test_a_session_with_spans_writes_each_turn(exported):
    from tests.agent.test_session_logic import make

    spans, exporter = exported
    session, svc, _ = make()
    session.svc = dataclasses.replace(svc, spans=spans)
    session.add_user_text("Hello?")
    session.respond()
    assert await session.wait_turn(10)
    (turn,) = [s for s in exporter.get_finished_spans() if s.name == "voice turn"]
    assert turn.attributes["gen_ai.usage.output_tokens"] > 0
    assert {"ttft", "first_token"} <= {s.name for s in exporter.get_finished_spans()}


def test_a_missing_opentelemetry_is_a_config_error_naming_the_key(monkeypatch):
    """Without the OTLP exporter (the ``otel`` extra), an endpoint is refused naming the key and
    the extra: ``build_spans`` says it, and the server's check turns it into a config error."""
    import sys

    from voicert.config import Config, ConfigError
    from voicert.server import app

    monkeypatch.setitem(sys.modules, "opentelemetry.exporter.otlp.proto.http.trace_exporter", None)
    with pytest.raises(ImportError, match=r"pip install 'voicert\[otel\]'"):
        build_spans("http://127.0.0.1:9/v1/traces", "voicert", "m")
    cfg = Config()
    cfg = dataclasses.replace(
        cfg, telemetry=dataclasses.replace(cfg.telemetry, otel_endpoint="http://x:4318/v1/traces")
    )
    with pytest.raises(ConfigError, match=r"telemetry.otel_endpoint.*voicert\[otel\]"):
        app.turn_spans(cfg)
