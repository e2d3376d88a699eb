"""The SDK set-up of a test job that exports over real OTLP/gRPC and then exits.

Jobs run as ``python -c`` subprocesses (with the repository on ``PYTHONPATH``) to test what
happens at a real process exit: spans through a ``BatchSpanProcessor``, metrics through a
``PeriodicExportingMetricReader`` whose interval (an hour) never fires, so whatever arrives was
delivered by the exit itself.
"""

from __future__ import annotations

from typing import Any


def sdk_over_otlp(metrics_endpoint: str, traces_endpoint: str | None = None) -> Any:
    """Global providers exporting to ``metrics_endpoint`` (spans to ``traces_endpoint`` if
    given); returns the tracer provider."""
    from opentelemetry import metrics, trace
    from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    provider = TracerProvider()
    exporter = OTLPSpanExporter(endpoint=traces_endpoint or metrics_endpoint, insecure=True)
    provider.add_span_processor(BatchSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    reader = PeriodicExportingMetricReader(
        OTLPMetricExporter(endpoint=metrics_endpoint, insecure=True),
        export_interval_millis=3_600_000,
    )
    metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))
    return provider
