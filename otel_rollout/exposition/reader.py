"""The reader behind ``rollout_prometheus``: collections on scrape, exemplar memory, classic
buckets; rendering goes to :mod:`.families` and the two writers, serving to :mod:`.server`."""

from __future__ import annotations

import gzip
import logging
import math
import threading
from collections.abc import Callable, Iterable, Iterator
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
    MetricReader,
    MetricsData,
)
from opentelemetry.sdk.metrics.export import Histogram as HistogramData

from otel_rollout import histograms
from otel_rollout.config import load_config
from otel_rollout.exposition import openmetrics, protobuf, server
from otel_rollout.exposition.families import ClassicBucket, Family, family_of, target_info

if TYPE_CHECKING:
    from opentelemetry.sdk.metrics.export import Metric

_logger = logging.getLogger("otel_rollout.exposition")


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
    """A pull reader serving ``/metrics``: Prometheus protobuf (native histograms) or OpenMetrics,
    both with exemplars."""

    def __init__(
        self, host: str | None = None, port: int | None = None, start_server: bool = True
    ) -> None:
        self.config = load_config(warn=False)
        super().__init__(
            preferred_aggregation=histograms.reader_aggregation(self.config),
            preferred_temporality={
                Counter: AggregationTemporality.CUMULATIVE,
                UpDownCounter: AggregationTemporality.CUMULATIVE,
                Histogram: AggregationTemporality.CUMULATIVE,
                ObservableCounter: AggregationTemporality.CUMULATIVE,
                ObservableUpDownCounter: AggregationTemporality.CUMULATIVE,
                ObservableGauge: AggregationTemporality.CUMULATIVE,
            },
        )
        self._latest: MetricsData | None = None
        self._refused: set[str] = set()
        self._exemplars: dict[tuple[str, frozenset[Any]], list[Any]] = {}
        self._exemplars_lock = threading.Lock()
        self._server: Any = None
        self.port: int | None = None
        """The port actually served (see :meth:`_serve`); ``None`` when nothing is served."""
        try:
            from prometheus_client import CollectorRegistry
        except ImportError:
            _logger.error(
                "otel_rollout: the rollout_prometheus metrics exporter needs "
                "prometheus-client (pip install 'otel-rollout[prometheus]'); "
                "no scrape endpoint was started"
            )
            self.registry = None
            return
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(_Collector(self))
        if start_server:
            self._serve(host, port)

    def _serve(self, host: str | None, port: int | None) -> None:
        """Listen on the configured port or the next free one (:func:`.server.serve`)."""
        self._server = server.serve(host, port, self.wsgi_app())
        self.port = None if self._server is None else self._server.server_port

    # --- MetricReader ------------------------------------------------------------------------

    def _receive_metrics(
        self, metrics_data: MetricsData, timeout_millis: float = 10_000, **kwargs: Any
    ) -> None:
        try:
            self._remember(metrics_data)
        except Exception:  # exemplars are a nicety; the scrape must still be served
            self._refuse("exemplars", "remembering them failed", exc_info=True)
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
        """prometheus_client families of one collection (the text exposition)."""
        for rm in data.resource_metrics:
            info = target_info(rm.resource)
            if info is not None:
                yield openmetrics.client_family(info)
            for sm in rm.scope_metrics:
                for metric in sm.metrics:
                    try:
                        family = self._family(metric)
                    except Exception:  # one metric we cannot render must not empty the scrape
                        self._refuse(metric.name, "rendering failed", exc_info=True)
                        continue
                    if family is not None:
                        yield family

    def wsgi_app(self) -> Callable[..., Any]:
        """The ``/metrics`` app: protobuf for scrapers that prefer it, else prometheus_client's."""
        from prometheus_client import make_wsgi_app

        assert self.registry is not None, "prometheus_client is required to serve"
        text_app = make_wsgi_app(self.registry)

        def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Any:
            if not server.wants_protobuf(environ.get("HTTP_ACCEPT", "")):
                return text_app(environ, start_response)
            data = self.collect_for_scrape()
            body = self.protobuf(data) if data is not None else b""
            headers = [("Content-Type", protobuf.CONTENT_TYPE)]
            if "gzip" in environ.get("HTTP_ACCEPT_ENCODING", ""):
                body = gzip.compress(body, compresslevel=1)
                headers.append(("Content-Encoding", "gzip"))
            headers.append(("Content-Length", str(len(body))))
            start_response("200 OK", headers)
            return [body]

        return app

    # --- OTel data -> classic buckets (both formats) ---------------------------------------------

    def _pairs(self, metric: Metric, point: Any) -> list[tuple[float, int]]:
        """(upper bound, cumulative count) classic buckets of a histogram point, +Inf last."""
        if isinstance(metric.data, ExponentialHistogram):
            bounds = histograms.explicit_bounds(metric.name, self.config)
            return histograms.classic_buckets(point, bounds)
        pairs, running = [], 0
        for bound, count in zip(
            [*point.explicit_bounds, math.inf], point.bucket_counts, strict=False
        ):
            running += count
            pairs.append((float(bound), running))
        return pairs

    @staticmethod
    def _latest_per_bucket(exemplars: Iterable[Any], uppers: list[float]) -> dict[int, Any]:
        by_bucket: dict[int, Any] = {}
        for ex in exemplars:
            index = next(i for i, b in enumerate(uppers) if ex.value <= b)
            kept = by_bucket.get(index)
            if kept is None or ex.time_unix_nano >= kept.time_unix_nano:
                by_bucket[index] = ex
        return by_bucket

    def _remember(self, data: MetricsData) -> None:
        """Keep each classic bucket's latest exemplar across collections.

        The SDK hands out a measurement's exemplar once, to the next collection. Every scrape
        collects, so with two scrapers (an HA pair, or a native and a classic Prometheus) each
        exemplar would reach only one of them; remembering the latest per bucket serves it to
        all (Prometheus ignores an exemplar it already stored).
        """
        with self._exemplars_lock:
            seen = set()
            for rm in data.resource_metrics:
                for sm in rm.scope_metrics:
                    for metric in sm.metrics:
                        if not isinstance(metric.data, (HistogramData, ExponentialHistogram)):
                            continue
                        for point in metric.data.data_points:
                            key = (metric.name, frozenset((point.attributes or {}).items()))
                            seen.add(key)
                            fresh = [
                                ex for ex in getattr(point, "exemplars", None) or () if ex.trace_id
                            ]
                            if not fresh:
                                continue
                            uppers = [b for b, _ in self._pairs(metric, point)]
                            kept = self._latest_per_bucket(
                                [*self._exemplars.get(key, ()), *fresh], uppers
                            )
                            self._exemplars[key] = list(kept.values())
            for key in set(self._exemplars) - seen:
                del self._exemplars[key]

    def classic(self, metric: Metric, point: Any) -> list[ClassicBucket]:
        """Cumulative classic buckets of a histogram point, each with its latest exemplar."""
        pairs = self._pairs(metric, point)
        with self._exemplars_lock:
            remembered = list(
                self._exemplars.get((metric.name, frozenset((point.attributes or {}).items())), ())
            )
        by_bucket = self._latest_per_bucket(remembered, [bound for bound, _ in pairs])
        out: list[ClassicBucket] = []
        for i, (bound, cumulative) in enumerate(pairs):
            ex = by_bucket.get(i)
            out.append(
                (
                    bound,
                    cumulative,
                    None
                    if ex is None
                    else (
                        format(ex.trace_id, "032x"),
                        format(ex.span_id, "016x"),
                        float(ex.value),
                        ex.time_unix_nano / 1e9,
                    ),
                )
            )
        return out

    # --- the two writers, over one family model -------------------------------------------------

    def _model(self, metric: Metric) -> Family | None:
        family = family_of(metric, self.classic)
        if family is None:
            self._refuse(metric.name, type(metric.data).__name__)
        return family

    def _family(self, metric: Metric) -> Any:
        """One metric for the text exposition (a prometheus_client family), or ``None``."""
        family = self._model(metric)
        return None if family is None else openmetrics.client_family(family)

    def _family_pb(self, metric: Metric) -> bytes | None:
        """One metric for the protobuf exposition (a delimited ``MetricFamily``), or ``None``."""
        family = self._model(metric)
        if family is None:
            return None
        try:
            return protobuf.encode(family)
        except ValueError as exc:  # an exponential histogram no native histogram can express
            self._refuse(metric.name, str(exc))
            return None

    def protobuf(self, data: MetricsData) -> bytes:
        """Length-delimited ``io.prometheus.client.MetricFamily`` messages for one scrape."""
        out = bytearray()
        for rm in data.resource_metrics:
            info = target_info(rm.resource)
            if info is not None:
                out += protobuf.encode(info)
            for sm in rm.scope_metrics:
                for metric in sm.metrics:
                    try:
                        family = self._family_pb(metric)
                    except Exception:  # one metric we cannot encode must not fail the scrape
                        self._refuse(metric.name, "encoding failed", exc_info=True)
                        continue
                    if family is not None:
                        out += family
        return bytes(out)

    def _refuse(self, name: str, why: str, exc_info: bool = False) -> None:
        if name not in self._refused:
            self._refused.add(name)
            _logger.error(
                "otel_rollout: metric %r (%s) cannot be served to Prometheus; it is left "
                "out of /metrics (the rest is served)",
                name,
                why,
                exc_info=exc_info,
            )
