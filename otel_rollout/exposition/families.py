"""One model of a scrape: OpenTelemetry metric data → Prometheus families, for both writers.

The text writer (:mod:`.openmetrics`) and the protobuf writer (:mod:`.protobuf`) differ only in
encoding; which points make which family, the label union, the counter / gauge / histogram
choice and the classic buckets with their exemplars are decided here once.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING, Any

from opentelemetry.sdk.metrics.export import ExponentialHistogram, Gauge, Sum
from opentelemetry.sdk.metrics.export import Histogram as HistogramData

from otel_rollout.exposition.names import label_name, metric_name

if TYPE_CHECKING:
    from opentelemetry.sdk.metrics.export import Metric
    from opentelemetry.sdk.resources import Resource

Exemplar = tuple[str, str, float, float]
"""(trace id hex, span id hex, value, time in seconds)."""
ClassicBucket = tuple[float, int, "Exemplar | None"]
"""(upper bound, cumulative count, the bucket's exemplar or None); +Inf last."""


class Kind(Enum):
    """Prometheus metric types, valued as ``io.prometheus.client.MetricType``."""

    COUNTER = 0
    GAUGE = 1
    HISTOGRAM = 4


@dataclass(frozen=True)
class HistogramSample:
    count: int
    total: float
    classic: list[ClassicBucket]
    exponential: Any | None
    """The OTel exponential point (for a native histogram), ``None`` for explicit buckets."""


@dataclass(frozen=True)
class Family:
    name: str
    """Prometheus name with its unit word; a counter's without ``_total`` (each writer adds it)."""
    doc: str
    kind: Kind
    unit: str
    labels: list[str]
    samples: list[tuple[list[str], float | HistogramSample]]
    """(label values in ``labels`` order, value) per point."""


def target_info(resource: Resource) -> Family | None:
    """The ``target_info`` gauge carrying the resource's attributes, as the stock exporter has it."""
    attrs = labels_of(resource.attributes)
    if not attrs:
        return None
    return Family(
        "target_info", "Target metadata", Kind.GAUGE, "", list(attrs), [([*attrs.values()], 1.0)]
    )


def labels_of(attributes: Mapping[str, Any] | None) -> dict[str, str]:
    return {label_name(k): str(v) for k, v in (attributes or {}).items()}


def family_of(
    metric: Metric, classic: Callable[[Metric, Any], list[ClassicBucket]]
) -> Family | None:
    """The family of one OTel metric; ``None`` for a kind of data Prometheus has no type for
    (the caller says so once). ``classic`` gives a histogram point's classic buckets."""
    data: Any = metric.data  # the SDK may grow new point kinds: those are refused, not fatal
    counter = isinstance(data, Sum) and data.is_monotonic
    name, unit = metric_name(metric.name, metric.unit or "", counter=counter)
    doc = metric.description or metric.name
    points: list[Any] = list(data.data_points)
    labels = sorted({label_name(k) for p in points for k in p.attributes})

    def values(point: Any) -> list[str]:
        own = labels_of(point.attributes)
        return [own.get(label, "") for label in labels]

    if isinstance(data, (HistogramData, ExponentialHistogram)):
        exponential = isinstance(data, ExponentialHistogram)
        samples: list[tuple[list[str], float | HistogramSample]] = [
            (
                values(p),
                HistogramSample(
                    p.count, float(p.sum), classic(metric, p), p if exponential else None
                ),
            )
            for p in points
        ]
        return Family(name, doc, Kind.HISTOGRAM, unit, labels, samples)
    if counter:
        return Family(
            name, doc, Kind.COUNTER, unit, labels, [(values(p), float(p.value)) for p in points]
        )
    if isinstance(data, (Sum, Gauge)):
        return Family(
            name, doc, Kind.GAUGE, unit, labels, [(values(p), float(p.value)) for p in points]
        )
    return None
