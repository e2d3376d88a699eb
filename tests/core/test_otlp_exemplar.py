"""Exemplars over real OTLP: what a Collector receives links the histogram point to the span."""

from __future__ import annotations

from typing import Any

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor

from otel_rollout.config import RolloutConfig
from otel_rollout.telemetry import Telemetry
from testkit.otlp_receiver import OTLPReceiver, attr
from testkit.records import make_record


def _exporters(protocol: str, receiver: OTLPReceiver) -> tuple[Any, Any]:
    if protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

        return (
            OTLPSpanExporter(endpoint=receiver.grpc_endpoint, insecure=True),
            OTLPMetricExporter(endpoint=receiver.grpc_endpoint, insecure=True),
        )
    from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    return (
        OTLPSpanExporter(endpoint=f"{receiver.http_endpoint}/v1/traces"),
        OTLPMetricExporter(endpoint=f"{receiver.http_endpoint}/v1/metrics"),
    )


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_exemplar_ids_match_the_received_span(protocol: str, otlp_receiver: OTLPReceiver) -> None:
    span_exporter, metric_exporter = _exporters(protocol, otlp_receiver)
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(BatchSpanProcessor(span_exporter))
    reader = PeriodicExportingMetricReader(metric_exporter, export_interval_millis=3_600_000)
    meter_provider = MeterProvider(metric_readers=[reader])
    try:
        telemetry = Telemetry(
            "vllm",
            tracer_provider.get_tracer("tests.core.otlp"),
            meter_provider.get_meter("tests.core.otlp"),
            RolloutConfig(),
        )
        model = f"otlp-{protocol}"
        for i in range(3):  # several requests: each exemplar must point at its own span
            telemetry.emit(
                make_record(
                    model,
                    request_id=f"{protocol}-{i}",
                    output_tokens=3 + i,
                    finish_ns=make_record(model).arrival_ns + (i + 1) * 10**9,
                )
            )
        assert telemetry.flush(10.0)  # our background emitter first, as sdk.force_flush does
        assert tracer_provider.force_flush(10_000)
        assert meter_provider.force_flush(10_000)
        assert otlp_receiver.wait_for(lambda r: len(r.spans()) >= 3 and r.metrics(), timeout=15)
        received_metrics = otlp_receiver.metrics()  # the one flushed export (shutdown sends again)
    finally:
        tracer_provider.shutdown()
        meter_provider.shutdown()

    spans = {attr(s.attributes, "gen_ai.response.id"): s for s in otlp_receiver.spans()}
    assert set(spans) == {f"{protocol}-{i}" for i in range(3)}
    by_span_id = {s.span_id: s for s in spans.values()}
    for span in spans.values():
        assert len(span.span_id) == 8 and len(span.trace_id) == 16

    (duration,) = [m for m in received_metrics if m.name == "gen_ai.server.request.duration"]
    (point,) = duration.histogram.data_points
    assert point.count == 3
    assert list(point.explicit_bounds)[:3] == [0.05, 0.1, 0.25]
    assert point.exemplars, "the histogram point carries exemplars over the wire"
    for exemplar in point.exemplars:
        span = by_span_id[exemplar.span_id]  # bytes on the wire == the received span's bytes
        assert exemplar.trace_id == span.trace_id
        assert exemplar.as_double == pytest.approx(
            (span.end_time_unix_nano - span.start_time_unix_nano) / 1e9
        )

    (tokens,) = [m for m in received_metrics if m.name == "gen_ai.client.token.usage"]
    output = [
        p
        for p in tokens.histogram.data_points
        if attr(p.attributes, "gen_ai.token.type") == "output"
    ]
    (out_point,) = output
    assert out_point.exemplars
    for exemplar in out_point.exemplars:
        span = by_span_id[exemplar.span_id]
        assert exemplar.trace_id == span.trace_id
        value = exemplar.as_double or exemplar.as_int
        assert value == attr(span.attributes, "gen_ai.usage.output_tokens")
