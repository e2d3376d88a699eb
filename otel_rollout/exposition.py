"""A Prometheus scrape endpoint that keeps exemplars and serves native histograms.

The stock ``opentelemetry-exporter-prometheus`` never writes exemplars, and a histogram with an
exponential aggregation makes every scrape fail with HTTP 500. This reader negotiates the format
with the scraper:

* Prometheus with ``--enable-feature=native-histograms`` asks for the protobuf exposition
  (``application/vnd.google.protobuf; proto=io.prometheus.client.MetricFamily;
  encoding=delimited``). Exponential histograms go out as native histograms (schema, zero bucket,
  spans, deltas) *and* classic buckets in the same ``Histogram`` message; the classic buckets
  carry the exemplars, which is where Prometheus 2.4x reads a native histogram's exemplars from.
* Anyone else gets OpenMetrics (or the 0.0.4 text format) through ``prometheus_client``, with
  exemplars on the buckets; exponential histograms are rendered as classic buckets derived from
  the exponential ones (:func:`otel_rollout.histograms.classic_buckets`).

Which histograms are exponential is decided by ``OTEL_ROLLOUT_HISTOGRAMS`` (see
:mod:`otel_rollout.histograms`); this reader asks the SDK for them through its
``preferred_aggregation``. Anything it cannot express is left out with one clear log line instead
of failing the whole scrape.

Select it like any exporter: ``OTEL_METRICS_EXPORTER=rollout_prometheus`` under
``opentelemetry-instrument``; it listens on ``OTEL_EXPORTER_PROMETHEUS_HOST``:
``OTEL_EXPORTER_PROMETHEUS_PORT`` (default ``localhost:9464``), path ``/metrics``. When that port
is taken (another worker on the node got it first) it takes the next free one of
``PORT_RANGE`` ports (9464–9479); ``0`` takes any free port. The port served is logged once.
"""

from __future__ import annotations

import errno
import gzip
import logging
import math
import os
import re
import socket
import struct
import threading
from collections.abc import Callable, Iterable, Iterator
from socketserver import ThreadingMixIn
from typing import TYPE_CHECKING, Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

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

from otel_rollout import histograms
from otel_rollout.config import load_config

if TYPE_CHECKING:
    from opentelemetry.sdk.metrics.export import Metric

_logger = logging.getLogger(__name__)

DEFAULT_PORT = 9464
"""The standard ``OTEL_EXPORTER_PROMETHEUS_PORT`` default."""
PORT_RANGE = 16
"""When the configured port is taken, the next ``PORT_RANGE - 1`` are tried (9464–9479 by
default): one port per process, for up to 16 processes per node. Scrape the whole range."""

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


PROTOBUF_CONTENT_TYPE = (
    "application/vnd.google.protobuf; proto=io.prometheus.client.MetricFamily; encoding=delimited"
)

# (upper bound, cumulative count, exemplar or None); exemplar = (trace_id, span_id, value, time_s)
ClassicBucket = tuple[float, int, "tuple[str, str, float, float] | None"]


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
        """Listen on the configured port, or the next free one of :data:`PORT_RANGE`.

        Several processes on one node (Ray workers, one per engine) read the same settings; the
        first takes the configured port, the next ones the ports after it. ``0`` asks the OS for
        any free port. Either way the port actually served is logged once, so a scrape config
        (static targets over the range, see prometheus/prometheus.yml) or a person can find it.
        """
        host = host or os.environ.get("OTEL_EXPORTER_PROMETHEUS_HOST", "localhost")
        raw_port = (
            os.environ.get("OTEL_EXPORTER_PROMETHEUS_PORT", str(DEFAULT_PORT))
            if port is None
            else port
        )
        try:
            wanted = int(raw_port)
            if not 0 <= wanted <= 65535:
                raise ValueError(raw_port)
        except ValueError:
            _logger.warning(
                "otel_rollout: OTEL_EXPORTER_PROMETHEUS_PORT=%r is not a port; using %d instead",
                raw_port,
                DEFAULT_PORT,
            )
            wanted = DEFAULT_PORT
        candidates = [0] if wanted == 0 else list(range(wanted, min(wanted + PORT_RANGE, 65536)))
        error: OSError | None = None
        for candidate in candidates:
            try:
                self._server = _start_server(host, candidate, self.wsgi_app())
                break
            except OSError as exc:
                error = exc
                if exc.errno != errno.EADDRINUSE:
                    break  # an unknown host, no permission: the next port will not help
        if self._server is None:
            last = candidates[-1]
            _logger.error(
                "otel_rollout: cannot serve metrics on %s:%s%s (%s); metrics are still "
                "collected but nobody can scrape them",
                host,
                wanted,
                f"..{last}" if last != wanted else "",
                error,
            )
            return
        self.port = self._server.server_port
        if self.port == wanted:
            _logger.info("otel_rollout: serving metrics on http://%s:%d/metrics", host, self.port)
        else:
            _logger.warning(
                "otel_rollout: serving metrics on http://%s:%d/metrics (%s)",
                host,
                self.port,
                "any free port, as OTEL_EXPORTER_PROMETHEUS_PORT=0 asks"
                if wanted == 0
                else f"port {wanted} is taken by another process",
            )

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
        from prometheus_client.core import GaugeMetricFamily

        for rm in data.resource_metrics:
            attrs = {label_name(k): str(v) for k, v in rm.resource.attributes.items()}
            if attrs:
                info = GaugeMetricFamily("target_info", "Target metadata", labels=list(attrs))
                info.add_metric(list(attrs.values()), 1)
                yield info
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
            if not wants_protobuf(environ.get("HTTP_ACCEPT", "")):
                return text_app(environ, start_response)
            data = self.collect_for_scrape()
            body = self.protobuf(data) if data is not None else b""
            headers = [("Content-Type", PROTOBUF_CONTENT_TYPE)]
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

    # --- protobuf exposition ---------------------------------------------------------------------

    def protobuf(self, data: MetricsData) -> bytes:
        """Length-delimited ``io.prometheus.client.MetricFamily`` messages for one scrape."""
        out = bytearray()
        for rm in data.resource_metrics:
            attrs = {label_name(k): str(v) for k, v in rm.resource.attributes.items()}
            if attrs:
                info = _metric(list(attrs.items()), gauge=1.0)
                out += _delimited(_family_pb("target_info", "Target metadata", _GAUGE, [info]))
            for sm in rm.scope_metrics:
                for metric in sm.metrics:
                    try:
                        family = self._family_pb(metric)
                    except Exception:  # one metric we cannot encode must not fail the scrape
                        self._refuse(metric.name, "encoding failed", exc_info=True)
                        continue
                    if family is not None:
                        out += _delimited(family)
        return bytes(out)

    def _family_pb(self, metric: Metric) -> bytes | None:
        data: Any = metric.data  # the SDK may grow new point kinds: those are refused, not fatal
        name, _unit = metric_name(metric.name, metric.unit or "")
        doc = metric.description or metric.name
        points: list[Any] = list(data.data_points)
        labels = sorted({label_name(k) for p in points for k in p.attributes})

        def pairs(point: Any) -> list[tuple[str, str]]:
            own = {label_name(k): str(v) for k, v in point.attributes.items()}
            return [(label, own.get(label, "")) for label in labels]

        if isinstance(data, (HistogramData, ExponentialHistogram)):
            metrics = []
            for p in points:
                try:
                    native = _native(p) if isinstance(data, ExponentialHistogram) else b""
                except ValueError as exc:
                    self._refuse(metric.name, str(exc))
                    return None
                classic = self.classic(metric, p)
                if native:
                    classic, native = _native_exemplars(classic, native)
                metrics.append(
                    _metric(pairs(p), histogram=_histogram_pb(p.count, p.sum, classic, native))
                )
            return _family_pb(name, doc, _HISTOGRAM, metrics)
        if isinstance(data, Sum) and data.is_monotonic:
            total = name if name.endswith("_total") else f"{name}_total"
            return _family_pb(
                total, doc, _COUNTER, [_metric(pairs(p), counter=float(p.value)) for p in points]
            )
        if isinstance(data, (Sum, Gauge)):
            return _family_pb(
                name, doc, _GAUGE, [_metric(pairs(p), gauge=float(p.value)) for p in points]
            )
        self._refuse(metric.name, type(data).__name__)
        return None

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

    def _family(self, metric: Metric) -> Any:
        from prometheus_client.core import (
            CounterMetricFamily,
            GaugeMetricFamily,
            HistogramMetricFamily,
        )

        data: Any = metric.data  # the SDK may grow new point kinds: those are refused, not fatal
        name, unit = metric_name(metric.name, metric.unit or "")
        doc = metric.description or metric.name
        points: list[Any] = list(data.data_points)
        labels = sorted({label_name(k) for p in points for k in p.attributes})

        def values(point: Any) -> list[str]:
            own = {label_name(k): str(v) for k, v in point.attributes.items()}
            return [own.get(label, "") for label in labels]

        if isinstance(data, (HistogramData, ExponentialHistogram)):
            family: Any = HistogramMetricFamily(name, doc, labels=labels, unit=unit)
            for p in points:
                family.add_metric(values(p), self._buckets(metric, p), p.sum)
            return family
        if isinstance(data, Sum) and data.is_monotonic:
            counter_name = name.removesuffix("_total")
            family = CounterMetricFamily(counter_name, doc, labels=labels, unit=unit)
            for p in points:
                family.add_metric(values(p), p.value)
            return family
        if isinstance(data, (Sum, Gauge)):
            family = GaugeMetricFamily(name, doc, labels=labels, unit=unit)
            for p in points:
                family.add_metric(values(p), p.value)
            return family
        self._refuse(metric.name, type(data).__name__)
        return None

    def _buckets(self, metric: Metric, point: Any) -> list[Any]:
        from prometheus_client.samples import Exemplar

        buckets: list[Any] = []
        for bound, cumulative, ex in self.classic(metric, point):
            if ex is None:
                buckets.append((_bound(bound), cumulative))
            else:
                trace_id, span_id, value, when = ex
                buckets.append(
                    (
                        _bound(bound),
                        cumulative,
                        Exemplar({"trace_id": trace_id, "span_id": span_id}, value, when),
                    )
                )
        return buckets


# --- serving -------------------------------------------------------------------------------------


def wants_protobuf(accept: str) -> bool:
    """True if the scraper ranks Prometheus' delimited protobuf above every text format."""
    best_proto, best_text = -1.0, -1.0
    for part in accept.split(","):
        fields = [f.strip() for f in part.split(";")]
        media, params = fields[0].lower(), fields[1:]
        q = 1.0
        for param in params:
            key, _, value = param.partition("=")
            if key.strip().lower() == "q":
                try:
                    q = float(value)
                except ValueError:
                    q = 0.0
        if media == "application/vnd.google.protobuf":
            joined = ";".join(p.replace(" ", "") for p in params)
            if "proto=io.prometheus.client.MetricFamily" in joined and (
                "encoding=delimited" in joined
            ):
                best_proto = max(best_proto, q)
        elif media:
            best_text = max(best_text, q)
    return best_proto > 0 and best_proto >= best_text


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        return None


def _start_server(host: str, port: int, app: Callable[..., Any]) -> WSGIServer:
    """A threaded WSGI server on (host, port), IPv4 or IPv6 as the host resolves."""
    family, _, _, _, sockaddr = socket.getaddrinfo(
        host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )[0]
    server_class = type(
        "_MetricsServer",
        (ThreadingMixIn, WSGIServer),
        {"daemon_threads": True, "address_family": family},
    )
    server: WSGIServer = make_server(
        str(sockaddr[0]), port, app, server_class, handler_class=_QuietHandler
    )
    threading.Thread(target=server.serve_forever, name="otel-rollout-metrics", daemon=True).start()
    return server


# --- a minimal encoder of io.prometheus.client (client_model metrics.proto, proto2) ------------
# Only what a scrape needs: MetricFamily, Metric, LabelPair, Gauge, Counter, Histogram, Bucket,
# BucketSpan, Exemplar, Timestamp. Repeated scalars are written unpacked, as proto2 declares them
# and client_golang sends them.

_COUNTER, _GAUGE, _HISTOGRAM = 0, 1, 4


def _varint(value: int) -> bytes:
    value &= (1 << 64) - 1  # negative int64 -> two's complement, as protobuf does
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _zigzag(value: int) -> int:
    return (value << 1) ^ (value >> 63)


def _tag(field: int, wire: int) -> bytes:
    return _varint(field << 3 | wire)


def _uint(field: int, value: int) -> bytes:
    return _tag(field, 0) + _varint(value)


def _sint(field: int, value: int) -> bytes:
    return _tag(field, 0) + _varint(_zigzag(value))


def _double(field: int, value: float) -> bytes:
    return _tag(field, 1) + struct.pack("<d", value)


def _bytes(field: int, payload: bytes) -> bytes:
    return _tag(field, 2) + _varint(len(payload)) + payload


def _string(field: int, value: str) -> bytes:
    return _bytes(field, value.encode("utf-8"))


def _delimited(message: bytes) -> bytes:
    return _varint(len(message)) + message


def _label(name: str, value: str) -> bytes:
    return _string(1, name) + _string(2, value)


def _family_pb(name: str, doc: str, kind: int, metrics: list[bytes]) -> bytes:
    out = _string(1, name) + _string(2, doc) + _uint(3, kind)
    return out + b"".join(_bytes(4, m) for m in metrics)


def _metric(
    labels: list[tuple[str, str]],
    *,
    gauge: float | None = None,
    counter: float | None = None,
    histogram: bytes | None = None,
) -> bytes:
    out = b"".join(_bytes(1, _label(k, v)) for k, v in labels)
    if gauge is not None:
        out += _bytes(2, _double(1, gauge))
    if counter is not None:
        out += _bytes(3, _double(1, counter))
    if histogram is not None:
        out += _bytes(7, histogram)
    return out


def _exemplar_pb(ex: tuple[str, str, float, float]) -> bytes:
    trace_id, span_id, value, when = ex
    seconds = math.floor(when)
    nanos = min(round((when - seconds) * 1e9), 999_999_999)
    timestamp = _uint(1, seconds) + _uint(2, nanos)
    return (
        _bytes(1, _label("trace_id", trace_id))
        + _bytes(1, _label("span_id", span_id))
        + _double(2, value)
        + _bytes(3, timestamp)
    )


def _histogram_pb(count: int, total: float, classic: list[ClassicBucket], native: bytes) -> bytes:
    out = _uint(1, int(count)) + _double(2, float(total))
    for bound, cumulative, ex in classic:
        bucket = _uint(1, cumulative) + _double(2, bound)
        if ex is not None:
            bucket += _bytes(3, _exemplar_pb(ex))
        out += _bytes(3, bucket)
    return out + native


def _native_exemplars(
    classic: list[ClassicBucket], native: bytes
) -> tuple[list[ClassicBucket], bytes]:
    """Place a native histogram's exemplars where each Prometheus version reads them.

    Prometheus 2.4x (before native-histogram exemplars) stores *one* exemplar per native
    histogram per scrape: the first classic bucket that carries one. Buckets go in increasing
    order, so that would always be the fastest request; keeping only the slowest exemplar on the
    classic buckets makes it the slowest request of the scrape interval — the one a long-tail
    panel wants to open. Later versions read every exemplar from the native ``exemplars`` field
    (16), in time order as their exemplar storage requires.
    """
    exemplars = [ex for _, _, ex in classic if ex is not None]
    if not exemplars:
        return classic, native
    slowest = max(exemplars, key=lambda ex: ex[2])
    kept = [(bound, cumulative, ex if ex is slowest else None) for bound, cumulative, ex in classic]
    native += b"".join(_bytes(16, _exemplar_pb(ex)) for ex in sorted(exemplars, key=lambda e: e[3]))
    return kept, native


def _native(point: Any) -> bytes:
    """Histogram fields 5–13 (native part) of an OTel exponential histogram point."""
    schema, positive_spans, positive = histograms.native_buckets(
        point.positive.offset, list(point.positive.bucket_counts), point.scale
    )
    _, negative_spans, negative = histograms.native_buckets(
        point.negative.offset, list(point.negative.bucket_counts), point.scale
    )
    out = _sint(5, schema) + _double(6, histograms.ZERO_THRESHOLD) + _uint(7, point.zero_count)
    for offset, length in negative_spans:
        out += _bytes(9, _sint(1, offset) + _uint(2, length))
    out += b"".join(_sint(10, d) for d in negative)
    for offset, length in positive_spans:
        out += _bytes(12, _sint(1, offset) + _uint(2, length))
    out += b"".join(_sint(13, d) for d in positive)
    return out
