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

from otel_rollout.exposition.names import label_name, metric_name
from otel_rollout.exposition.protobuf import CONTENT_TYPE as PROTOBUF_CONTENT_TYPE
from otel_rollout.exposition.reader import OpenMetricsExemplarReader
from otel_rollout.exposition.server import DEFAULT_PORT, PORT_RANGE, wants_protobuf

__all__ = [
    "DEFAULT_PORT",
    "PORT_RANGE",
    "PROTOBUF_CONTENT_TYPE",
    "OpenMetricsExemplarReader",
    "label_name",
    "metric_name",
    "wants_protobuf",
]
