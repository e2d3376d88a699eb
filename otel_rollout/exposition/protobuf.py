"""The protobuf writer: a :class:`~.families.Family` as a length-delimited
``io.prometheus.client.MetricFamily``, the format Prometheus asks for with native histograms on.

A minimal encoder of client_model's metrics.proto (proto2): only what a scrape needs
(MetricFamily, Metric, LabelPair, Gauge, Counter, Histogram, Bucket, BucketSpan, Exemplar,
Timestamp). Repeated scalars are written unpacked, as proto2 declares them and client_golang sends
them. Written by hand rather than generated: the package would otherwise need a protobuf runtime
and a compiled descriptor for seven messages.
"""

from __future__ import annotations

import math
import struct
from typing import Any

from otel_rollout import histograms
from otel_rollout.exposition.families import (
    ClassicBucket,
    Exemplar,
    Family,
    HistogramSample,
    Kind,
)

CONTENT_TYPE = (
    "application/vnd.google.protobuf; proto=io.prometheus.client.MetricFamily; encoding=delimited"
)


def encode(family: Family) -> bytes:
    """One delimited ``MetricFamily``. Raises ``ValueError`` for an exponential histogram that a
    native histogram cannot express (the caller leaves that metric out)."""
    name = family.name
    if family.kind is Kind.COUNTER and not name.endswith("_total"):
        name = f"{name}_total"
    metrics = []
    for values, value in family.samples:
        labels = list(zip(family.labels, values, strict=True))
        if isinstance(value, HistogramSample):
            classic, native_part = value.classic, b""
            if value.exponential is not None:
                native_part = native(value.exponential)
                classic, native_part = native_exemplars(classic, native_part)
            metrics.append(
                _metric(
                    labels, histogram=_histogram(value.count, value.total, classic, native_part)
                )
            )
        elif family.kind is Kind.COUNTER:
            metrics.append(_metric(labels, counter=value))
        else:
            metrics.append(_metric(labels, gauge=value))
    body = _string(1, name) + _string(2, family.doc) + _uint(3, family.kind.value)
    return _delimited(body + b"".join(_bytes(4, m) for m in metrics))


def native_exemplars(
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
    native += b"".join(_bytes(16, _exemplar(ex)) for ex in sorted(exemplars, key=lambda e: e[3]))
    return kept, native


def native(point: Any) -> bytes:
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


# --- wire format ---------------------------------------------------------------------------------


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


def _exemplar(ex: Exemplar) -> bytes:
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


def _histogram(count: int, total: float, classic: list[ClassicBucket], native: bytes) -> bytes:
    out = _uint(1, int(count)) + _double(2, float(total))
    for bound, cumulative, ex in classic:
        bucket = _uint(1, cumulative) + _double(2, bound)
        if ex is not None:
            bucket += _bytes(3, _exemplar(ex))
        out += _bytes(3, bucket)
    return out + native
