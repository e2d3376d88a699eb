"""The text writer: a :class:`~.families.Family` as a ``prometheus_client`` metric family, which
``prometheus_client`` renders as OpenMetrics (with exemplars) or the 0.0.4 text format."""

from __future__ import annotations

from typing import Any

from otel_rollout.exposition.families import Family, HistogramSample, Kind


def _bound(value: float) -> str:
    return "+Inf" if value == float("inf") else repr(float(value))


def client_family(family: Family) -> Any:
    from prometheus_client.core import (
        CounterMetricFamily,
        GaugeMetricFamily,
        HistogramMetricFamily,
    )
    from prometheus_client.samples import Exemplar

    kind: Any = {
        Kind.COUNTER: CounterMetricFamily,
        Kind.GAUGE: GaugeMetricFamily,
        Kind.HISTOGRAM: HistogramMetricFamily,
    }[family.kind]
    out = kind(family.name, family.doc, labels=family.labels, unit=family.unit)
    for values, value in family.samples:
        if not isinstance(value, HistogramSample):
            out.add_metric(values, value)
            continue
        buckets: list[Any] = []
        for bound, cumulative, ex in value.classic:
            if ex is None:
                buckets.append((_bound(bound), cumulative))
            else:
                trace_id, span_id, seen, when = ex
                buckets.append(
                    (
                        _bound(bound),
                        cumulative,
                        Exemplar({"trace_id": trace_id, "span_id": span_id}, seen, when),
                    )
                )
        out.add_metric(values, buckets, value.total)
    return out
