"""A provider's own ``force_flush()`` and ``shutdown()`` deliver every record we have taken.

Standard OTel code — a test with ``InMemorySpanExporter``, a shutdown path, a Ray worker, another
library — flushes its providers and expects the spans and points of calls that already returned.
These tests use the SDK's public API only for that: no otel_rollout flush is called. The records
are handed over exactly as the engine wrappers hand them (``Telemetry.emit_all`` right after
``generate`` returned), many at once so the background emitter is still busy when the flush comes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import (
    MetricExporter,
    MetricExportResult,
    MetricsData,
    PeriodicExportingMetricReader,
)
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from otel_rollout.telemetry import create_telemetry
from testkit.records import make_record

CALLS, PER_CALL = 5, 256


class CountingMetricExporter(MetricExporter):
    """Keeps what it is given (the SDK ships no in-memory push exporter)."""

    def __init__(self) -> None:
        super().__init__()
        self.batches: list[MetricsData] = []

    def export(self, metrics_data: MetricsData, timeout_millis: float = 10_000, **_: Any) -> Any:
        self.batches.append(metrics_data)
        return MetricExportResult.SUCCESS

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return True

    def shutdown(self, timeout_millis: float = 30_000, **_: Any) -> None:
        pass

    def duration_count(self) -> int:
        """Requests counted in ``gen_ai.server.request.duration`` (cumulative: the last export)."""
        counts = [
            sum(p.count for p in m.data.data_points)
            for batch in self.batches
            for rm in batch.resource_metrics
            for sm in rm.scope_metrics
            for m in sm.metrics
            if m.name == "gen_ai.server.request.duration"
        ]
        return counts[-1] if counts else 0


def _pipeline(batch: bool) -> tuple[TracerProvider, MeterProvider, Any, CountingMetricExporter]:
    spans, points = InMemorySpanExporter(), CountingMetricExporter()
    tp = TracerProvider()
    tp.add_span_processor(BatchSpanProcessor(spans) if batch else SimpleSpanProcessor(spans))
    reader = PeriodicExportingMetricReader(points, export_interval_millis=3_600_000)
    return tp, MeterProvider(metric_readers=[reader]), spans, points


def _generate(telemetry: Any, model: str, calls: Sequence[int]) -> None:
    for call, size in enumerate(calls):
        telemetry.emit_all([make_record(model, request_id=f"{call}-{i}") for i in range(size)])


@pytest.mark.parametrize("batch", [False, True], ids=["simple", "batch"])
def test_force_flush_of_the_providers_delivers_every_request(batch: bool, model: str) -> None:
    tp, mp, spans, points = _pipeline(batch)
    telemetry = create_telemetry("vllm", tp, mp)
    _generate(telemetry, model, [1])
    assert tp.force_flush()  # right after one call: its one span is there
    assert len(spans.get_finished_spans()) == 1
    _generate(telemetry, model, [PER_CALL] * CALLS)
    assert tp.force_flush()
    assert len(spans.get_finished_spans()) == 1 + CALLS * PER_CALL
    assert mp.force_flush()
    assert points.duration_count() == 1 + CALLS * PER_CALL
    tp.shutdown()
    mp.shutdown()


def test_shutdown_of_the_providers_delivers_every_request(model: str) -> None:
    tp, mp, spans, points = _pipeline(batch=True)
    telemetry = create_telemetry("vllm", tp, mp)
    _generate(telemetry, model, [PER_CALL] * CALLS)
    mp.shutdown()
    tp.shutdown()
    assert len(spans.get_finished_spans()) == CALLS * PER_CALL
    assert points.duration_count() == CALLS * PER_CALL


def test_a_timeout_given_positionally_is_kept(model: str) -> None:
    """``force_flush(5000)``: the time the emitter took is taken off the provider's own wait."""
    tp, mp, spans, points = _pipeline(batch=True)
    telemetry = create_telemetry("vllm", tp, mp)
    _generate(telemetry, model, [PER_CALL])
    assert tp.force_flush(5000) and mp.force_flush(5000)
    assert len(spans.get_finished_spans()) == PER_CALL
    assert points.duration_count() == PER_CALL
    tp.shutdown()
    mp.shutdown()
