"""A Prometheus scrape endpoint that keeps exemplars: the link from a slow bucket to its trace.

The stock ``opentelemetry-exporter-prometheus`` never writes exemplars, and a histogram with an
exponential aggregation makes every scrape fail with HTTP 500. This reader renders OpenMetrics
(the format Prometheus asks for when exemplar storage is on) with each bucket's exemplar carrying
``trace_id``/``span_id``, and leaves out — with one clear log line — any metric it cannot
express, instead of failing the whole scrape.

Select it like any exporter: ``OTEL_METRICS_EXPORTER=rollout_prometheus`` under
``opentelemetry-instrument``; it listens on ``OTEL_EXPORTER_PROMETHEUS_HOST``:
``OTEL_EXPORTER_PROMETHEUS_PORT`` (default ``localhost:9464``), path ``/metrics``.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

from opentelemetry.sdk.metrics import (
    Counter,
    Histogram,
    ObservableCounter,
    ObservableGauge,
    ObservableUpDownCounter,
    UpDownCounter,
)
from opentelemetry.sdk.metrics.export import (
    AggregationTemporality,
    ExponentialHistogram,
    Gauge,
    MetricReader,
    MetricsData,
    Sum,
)
from opentelemetry.sdk.metrics.export import Histogram as HistogramData

if TYPE_CHECKING:
    from opentelemetry.sdk.metrics.export import Metric

_logger = logging.getLogger(__name__)

_UNITS = {"s": "seconds", "ms": "milliseconds", "By": "bytes", "%": "percent"}
_INVALID = re.compile(r"[^a-zA-Z0-9_:]")
_INVALID_LABEL = re.compile(r"[^a-zA-Z0-9_]")


def metric_name(name: str, unit: str) -> tuple[str, str]:
    """(Prometheus name, unit) as the stock exporter renders them: ``a.b`` in ``s`` → a_b_seconds."""
    base = _INVALID.sub("_", name)
    suffix = _UNITS.get(unit, "")
    if suffix and not base.endswith("_" + suffix):
        base = f"{base}_{suffix}"
    return base, suffix


def label_name(key: str) -> str:
    label = _INVALID_LABEL.sub("_", key)
    return f"_{label}" if label[:1].isdigit() else label


def _bound(value: float) -> str:
    return "+Inf" if value == float("inf") else repr(float(value))


class _Collector:
    """prometheus_client collector over the reader's latest collection."""

    def __init__(self, reader: OpenMetricsExemplarReader) -> None:
        self._reader = reader

    def collect(self) -> Iterator[Any]:
        data = self._reader.collect_for_scrape()
        if data is None:
            return
        yield from self._reader.families(data)


class OpenMetricsExemplarReader(MetricReader):
    """A pull reader serving OpenMetrics with exemplars on ``/metrics``."""

    def __init__(self, host: str | None = None, port: int | None = None,
                 start_server: bool = True) -> None:
        super().__init__(preferred_temporality={
            Counter: AggregationTemporality.CUMULATIVE,
            UpDownCounter: AggregationTemporality.CUMULATIVE,
            Histogram: AggregationTemporality.CUMULATIVE,
            ObservableCounter: AggregationTemporality.CUMULATIVE,
            ObservableUpDownCounter: AggregationTemporality.CUMULATIVE,
            ObservableGauge: AggregationTemporality.CUMULATIVE,
        })
        self._latest: MetricsData | None = None
        self._refused: set[str] = set()
        self._server: Any = None
        try:
            from prometheus_client import CollectorRegistry
        except ImportError:
            _logger.error("otel_rollout: the rollout_prometheus metrics exporter needs "
                          "prometheus-client (pip install 'otel-rollout[prometheus]'); "
                          "no scrape endpoint was started")
            self.registry = None
            return
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(_Collector(self))
        if start_server:
            self._serve(host, port)

    def _serve(self, host: str | None, port: int | None) -> None:
        from prometheus_client import start_http_server

        host = host or os.environ.get("OTEL_EXPORTER_PROMETHEUS_HOST", "localhost")
        raw_port = os.environ.get("OTEL_EXPORTER_PROMETHEUS_PORT", "9464") if port is None else port
        try:
            chosen = int(raw_port)
        except ValueError:
            _logger.warning("otel_rollout: OTEL_EXPORTER_PROMETHEUS_PORT=%r is not a port; "
                            "using 9464 instead", raw_port)
            chosen = 9464
        try:
            self._server, _ = start_http_server(chosen, addr=host, registry=self.registry)
        except OSError as exc:
            _logger.error("otel_rollout: cannot serve metrics on %s:%s (%s); metrics are still "
                          "collected but nobody can scrape them", host, chosen, exc)
            return
        self.port = self._server.server_port

    # --- MetricReader ------------------------------------------------------------------------

    def _receive_metrics(self, metrics_data: MetricsData, timeout_millis: float = 10_000,
                         **kwargs: Any) -> None:
        self._latest = metrics_data

    def collect_for_scrape(self) -> MetricsData | None:
        self.collect()
        return self._latest

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    # --- rendering -------------------------------------------------------------------------------

    def families(self, data: MetricsData) -> Iterable[Any]:
        from prometheus_client.core import GaugeMetricFamily

        for rm in data.resource_metrics:
            attrs = {label_name(k): str(v) for k, v in rm.resource.attributes.items()}
            if attrs:
                info = GaugeMetricFamily("target_info", "Target metadata", labels=list(attrs))
                info.add_metric(list(attrs.values()), 1)
                yield info
            for sm in rm.scope_metrics:
                for metric in sm.metrics:
                    family = self._family(metric)
                    if family is not None:
                        yield family

    def _family(self, metric: Metric) -> Any:
        from prometheus_client.core import (
            CounterMetricFamily,
            GaugeMetricFamily,
            HistogramMetricFamily,
        )

        data = metric.data
        name, unit = metric_name(metric.name, metric.unit or "")
        doc = metric.description or metric.name
        points = list(data.data_points)
        labels = sorted({label_name(k) for p in points for k in p.attributes})

        def values(point: Any) -> list[str]:
            own = {label_name(k): str(v) for k, v in point.attributes.items()}
            return [own.get(label, "") for label in labels]

        if isinstance(data, HistogramData):
            family = HistogramMetricFamily(name, doc, labels=labels, unit=unit)
            for p in points:
                family.add_metric(values(p), self._buckets(p), p.sum)
            return family
        if isinstance(data, Sum) and data.is_monotonic:
            counter_name = name[:-6] if name.endswith("_total") else name
            family = CounterMetricFamily(counter_name, doc, labels=labels, unit=unit)
            for p in points:
                family.add_metric(values(p), p.value)
            return family
        if isinstance(data, (Sum, Gauge)):
            family = GaugeMetricFamily(name, doc, labels=labels, unit=unit)
            for p in points:
                family.add_metric(values(p), p.value)
            return family
        if metric.name not in self._refused:
            self._refused.add(metric.name)
            kind = "an exponential histogram" if isinstance(data, ExponentialHistogram) else (
                type(data).__name__)
            _logger.error(
                "otel_rollout: metric %r is %s, which Prometheus' text formats cannot express; "
                "it is left out of /metrics (the rest is served). Remove the View that selects an "
                "exponential aggregation for it, or export it over OTLP instead.",
                metric.name, kind)
        return None

    @staticmethod
    def _buckets(point: Any) -> list[Any]:
        from prometheus_client.samples import Exemplar

        bounds = list(point.explicit_bounds) + [float("inf")]
        by_bucket: dict[int, Any] = {}
        for ex in getattr(point, "exemplars", None) or ():
            if not ex.trace_id:
                continue
            index = next(i for i, b in enumerate(bounds) if ex.value <= b)
            by_bucket[index] = Exemplar(
                {"trace_id": format(ex.trace_id, "032x"), "span_id": format(ex.span_id, "016x")},
                ex.value, ex.time_unix_nano / 1e9)
        buckets: list[Any] = []
        running = 0
        for i, (bound, count) in enumerate(zip(bounds, point.bucket_counts)):
            running += count
            exemplar = by_bucket.get(i)
            buckets.append((_bound(bound), running, exemplar) if exemplar else (_bound(bound), running))
        return buckets
