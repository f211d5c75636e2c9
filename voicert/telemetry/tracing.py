"""Opt-in OpenTelemetry traces: one span per turn, a child span per latency stage, exported over
OTLP/HTTP (``telemetry.otel_endpoint``; "" turns it off, the default).

A turn's span runs from its first marked point (usually the caller's last voiced audio) to its
last (the reply's end). It carries the GenAI semantic conventions where they fit
(``gen_ai.operation.name`` ``chat``, ``gen_ai.provider.name``, ``gen_ai.request.model``,
``gen_ai.usage.input_tokens`` / ``output_tokens``, ``gen_ai.response.finish_reasons``) and voicert's
own (``voicert.session.id``, ``voicert.turn.id``, ``voicert.ttft_ms``). Each stage of
``telemetry/latency.py``'s table that ran forwards is a child span named after it (``endpoint``,
``asr_decode``, ``prefill``, ...): the same figures as ``turn.latency``, placed on a time axis, as
Langfuse, Grafana Tempo or Jaeger show them. Stages that ran backwards (a reply started ahead of its
endpoint: ``dispatch`` negative) are attributes of the turn's span instead.

The timestamps are the turn's monotonic points, moved onto the wall clock once per turn.
"""

from __future__ import annotations

import time
from typing import Any

from voicert.telemetry.latency import STAGES, TurnRecord, TurnTrace

PROVIDER = "voicert"


class TurnSpans:
    """Writes each finished turn as spans on ``tracer`` (an OpenTelemetry ``Tracer``)."""

    def __init__(self, tracer: Any, model: str = "") -> None:
        self.tracer = tracer
        self.model = model

    def turn(self, trace: TurnTrace, record: TurnRecord, prompt_tokens: int = 0) -> None:
        """The spans of one finished turn (its trace's points, its record's outcome)."""
        from opentelemetry import trace as otel

        points = trace.points
        if not points:
            return
        to_wall = time.time_ns() - time.perf_counter_ns()  # monotonic -> epoch, this turn
        backwards = {}
        attributes: dict[str, Any] = {
            "gen_ai.operation.name": "chat",
            "gen_ai.provider.name": PROVIDER,
            "gen_ai.request.model": self.model,
            "gen_ai.usage.input_tokens": prompt_tokens,
            "gen_ai.usage.output_tokens": record.tokens,
            "gen_ai.response.finish_reasons": (record.finish_reason,),
            "voicert.session.id": record.session_id,
            "voicert.turn.id": record.turn_id,
        }
        if record.ttft_ms is not None:
            attributes["voicert.ttft_ms"] = record.ttft_ms
        parent = self.tracer.start_span(
            "voice turn", start_time=min(points.values()) + to_wall, attributes=attributes
        )
        context = otel.set_span_in_context(parent)
        for stage in STAGES:
            a, b = points.get(stage.start), points.get(stage.end)
            if a is None or b is None:
                continue
            if b < a:
                backwards[f"voicert.stage.{stage.name}"] = (b - a) / 1e6
                continue
            child = self.tracer.start_span(
                stage.name.removesuffix("_ms"), context=context, start_time=a + to_wall
            )
            child.end(end_time=b + to_wall)
        parent.set_attributes(backwards)
        parent.end(end_time=max(points.values()) + to_wall)


def build_spans(endpoint: str, service: str, model: str) -> TurnSpans | None:
    """The turn spans exported to ``endpoint`` (OTLP/HTTP, e.g.
    ``http://collector:4318/v1/traces``), or None when it is "". Raises ImportError, naming the
    extra, when OpenTelemetry is not installed."""
    if not endpoint:
        return None
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError as exc:
        raise ImportError(
            f"telemetry.otel_endpoint needs OpenTelemetry: pip install 'voicert[otel]' ({exc})"
        ) from None
    provider = TracerProvider(resource=Resource.create({"service.name": service}))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint)))
    return TurnSpans(provider.get_tracer("voicert"), model)
