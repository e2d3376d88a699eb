"""Exponential (base-2) histograms for the long-tail instruments, and the maths to serve them.

RL request latencies span five orders of magnitude. Fixed buckets are either too coarse where most
requests are or too few in the tail: on a real rollout the classic p99 read 0.865 s where the true
p99 was 0.563 s, because the bucket was 0.5–1 s wide. A base-2 exponential histogram keeps a
constant *relative* resolution (at most 160 buckets, ≤ 2^(1/2^scale) wide each) over any range,
and maps one to one onto a Prometheus native histogram.

What is exponential (``OTEL_ROLLOUT_HISTOGRAMS=exponential``, the default): request duration, time
to first token, time per output token, queue time and token usage of the ``otel_rollout.*``
instrumentation scopes — never another library's instruments, never the per-step histograms
(one point per step: their classic ``_sum``/``_count`` feed the recording rules).

How a process gets them, by who builds the ``MeterProvider``:

* code that builds it (Ray workers, tests, your own set-up): ``MeterProvider(views=views(config))``.
  The SDK takes views only at construction. Do not combine these views with the stock
  ``opentelemetry-exporter-prometheus`` reader: it fails every scrape on exponential histograms.
* zero-code (``opentelemetry-instrument``): the SDK's configurator takes no views. Our scrape
  reader (``OTEL_METRICS_EXPORTER=rollout_prometheus``) asks for them itself through
  :func:`reader_aggregation`; OTLP exporters read the standard
  ``OTEL_EXPORTER_OTLP_METRICS_DEFAULT_HISTOGRAM_AGGREGATION=base2_exponential_bucket_histogram``
  (:func:`otlp_environment`), which applies to every histogram they export.

The OpenTelemetry API's only advisory is explicit boundaries, so the instruments keep advertising
the RL-sized explicit buckets (``OTEL_ROLLOUT_*_BUCKETS``): they are the fallback where nothing asks
for exponential aggregation, what ``explicit`` selects, and the ``le`` boundaries of the classic
buckets our endpoint derives for text-only scrapers (:func:`classic_buckets`).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from typing import Any

from opentelemetry.sdk.metrics import Histogram
from opentelemetry.sdk.metrics.view import (
    Aggregation,
    DefaultAggregation,
    ExponentialBucketHistogramAggregation,
    View,
)
from opentelemetry.semconv._incubating.metrics import gen_ai_metrics

from otel_rollout.config import RolloutConfig, load_config
from otel_rollout.sdk_internals import ChoosingAggregation, ReservoirFactory, aligned_reservoir
from otel_rollout.semconv import (
    GEN_AI_OPERATION_INPUT_TOKENS,
    GEN_AI_OPERATION_OUTPUT_TOKENS,
    ROLLOUT_QUEUE_TIME,
)

_logger = logging.getLogger(__name__)

OTLP_AGGREGATION_ENV = "OTEL_EXPORTER_OTLP_METRICS_DEFAULT_HISTOGRAM_AGGREGATION"
SCOPE_PREFIX = "otel_rollout."
"""Our instrumentation scopes are ``otel_rollout.<engine>``; only their instruments are changed."""

# OTel instrument name -> the RolloutConfig attribute holding its explicit (classic) boundaries.
EXPONENTIAL_INSTRUMENTS: dict[str, str] = {
    gen_ai_metrics.GEN_AI_SERVER_REQUEST_DURATION: "latency_buckets",
    gen_ai_metrics.GEN_AI_SERVER_TIME_TO_FIRST_TOKEN: "ttft_buckets",
    gen_ai_metrics.GEN_AI_SERVER_TIME_PER_OUTPUT_TOKEN: "tpot_buckets",
    gen_ai_metrics.GEN_AI_CLIENT_TOKEN_USAGE: "token_buckets",
    GEN_AI_OPERATION_INPUT_TOKENS: "token_buckets",  # with gen_ai_latest_experimental
    GEN_AI_OPERATION_OUTPUT_TOKENS: "token_buckets",
    ROLLOUT_QUEUE_TIME: "latency_buckets",
}

# 160 buckets (the SDK default) cover 2^20 (e.g. 3.5 ms .. 1 h) at scale 3 (9 % wide buckets),
# two decades at scale 4 (4 %), one at scale 5 (2 %). Scale 8 is the finest Prometheus native
# histograms store; a finer one would only be merged away at exposition.
MAX_SIZE = 160
MAX_SCALE = 8

# Prometheus' (client_golang's) default zero threshold: 2^-128. A non-zero threshold also marks
# the protobuf Histogram as native for Prometheus 2.4x, even when it holds no observation yet.
ZERO_THRESHOLD = 2.0**-128
PROMETHEUS_MAX_SCHEMA = 8
PROMETHEUS_MIN_SCHEMA = -4


def exponential(config: RolloutConfig) -> bool:
    return config.histograms == "exponential"


def explicit_bounds(name: str, config: RolloutConfig) -> tuple[float, ...] | None:
    """The configured explicit boundaries of one of our instruments (by OTel name), else None."""
    attr = EXPONENTIAL_INSTRUMENTS.get(name)
    return None if attr is None else tuple(getattr(config, attr))


class RolloutHistogramAggregation(ChoosingAggregation):
    """Exponential for our long-tail instruments, the SDK default for everything else.

    A reader's ``preferred_aggregation`` applies to *every* histogram it sees; this aggregation
    narrows it to ``otel_rollout.*`` instruments listed in :data:`EXPONENTIAL_INSTRUMENTS`, so
    step histograms, other libraries' histograms and ours under ``explicit`` keep their explicit
    (advisory) buckets. Used both in :func:`views` and in :func:`reader_aggregation`.
    """

    def __init__(self, config: RolloutConfig) -> None:
        self._config = config
        self._exponential = ExponentialBucketHistogramAggregation(
            max_size=MAX_SIZE, max_scale=MAX_SCALE
        )
        self._default = DefaultAggregation()

    def ours(self, instrument: Any) -> tuple[float, ...] | None:
        scope = getattr(getattr(instrument, "instrumentation_scope", None), "name", "") or ""
        if not scope.startswith(SCOPE_PREFIX) or not isinstance(instrument, Histogram):
            return None
        return explicit_bounds(instrument.name, self._config)

    def choose(self, instrument: Any) -> tuple[Aggregation, ReservoirFactory | None]:
        """Exponential with an exemplar reservoir aligned on the classic buckets, for ours.

        The SDK's reservoir for exponential histograms keeps 20 *random* measurements per
        collection, which usually misses the one slow request the long-tail dashboard wants to
        open. Aligning the reservoir on the classic boundaries keeps the tail bucket's exemplar.
        """
        bounds = self.ours(instrument) if exponential(self._config) else None
        if bounds is None:
            return self._default, None
        return self._exponential, aligned_reservoir(bounds)

    def fallback(self, instrument: Any, chosen: Aggregation, error: Exception) -> Aggregation:
        if chosen is self._default:
            raise error
        _logger.warning(  # an SDK whose internals moved: explicit buckets still work
            "otel_rollout: exponential aggregation unavailable for %s; using explicit buckets",
            instrument.name,
            exc_info=error,
        )
        return self._default


def views(config: RolloutConfig | None = None) -> list[View]:
    """Views making our long-tail histograms exponential, for ``MeterProvider(views=...)``.

    Empty under ``OTEL_ROLLOUT_HISTOGRAMS=explicit``. They match by instrument name and leave any
    other scope's instrument of the same name (e.g. another GenAI instrumentation's token usage)
    on the default aggregation.
    """
    config = config or load_config(warn=False)
    if not exponential(config):
        return []
    aggregation = RolloutHistogramAggregation(config)
    return [
        View(instrument_type=Histogram, instrument_name=name, aggregation=aggregation)
        for name in EXPONENTIAL_INSTRUMENTS
    ]


def reader_aggregation(config: RolloutConfig | None = None) -> dict[type, Aggregation]:
    """``preferred_aggregation`` for a reader that can carry exponential histograms."""
    config = config or load_config(warn=False)
    return {Histogram: RolloutHistogramAggregation(config)} if exponential(config) else {}


def otlp_environment(config: RolloutConfig | None = None) -> dict[str, str]:
    """The standard variable that makes OTLP metric exporters aggregate histograms exponentially.

    Set it (if unset) before an ``OTLPMetricExporter`` is built, e.g. in a launcher's environment.
    Unlike :func:`views` it applies to every histogram the exporter sees.
    """
    config = config or load_config(warn=False)
    return (
        {OTLP_AGGREGATION_ENV: "base2_exponential_bucket_histogram"} if exponential(config) else {}
    )


# --- OTel exponential point -> Prometheus native histogram / classic buckets ---------------------


def native_buckets(
    offset: int, counts: Sequence[int], scale: int
) -> tuple[int, list[tuple[int, int]], list[int]]:
    """(schema, spans [(offset, length)], deltas) of one side of a Prometheus native histogram.

    OTel bucket ``i`` at scale ``s`` holds (2^(i/2^s), 2^((i+1)/2^s)]; Prometheus bucket ``j`` at
    schema ``s`` holds (2^((j-1)/2^s), 2^(j/2^s)], so ``j = i + 1``. Scales above 8 are merged
    down to schema 8 (``i >> (scale - 8)``), the finest Prometheus stores. Spans skip runs of
    empty buckets (gaps of more than two, as client_golang does); deltas are each bucket's count
    minus the previous one's, across spans.
    """
    shift = 0
    if scale > PROMETHEUS_MAX_SCHEMA:
        shift = scale - PROMETHEUS_MAX_SCHEMA
    if scale < PROMETHEUS_MIN_SCHEMA:
        raise ValueError(f"scale {scale} is below Prometheus' smallest schema -4")
    merged: dict[int, int] = {}
    for i, count in enumerate(counts):
        if count:
            index = ((offset + i) >> shift) + 1
            merged[index] = merged.get(index, 0) + count
    spans: list[tuple[int, int]] = []
    deltas: list[int] = []
    previous_index: int | None = None
    previous_count = 0
    for index in sorted(merged):
        if previous_index is None:
            spans.append((index, 1))
        else:
            gap = index - previous_index - 1
            if gap > 2:
                spans.append((gap, 1))
            else:  # cheaper to spell a short gap as empty buckets than to open a span
                for _ in range(gap):
                    deltas.append(-previous_count)
                    previous_count = 0
                spans[-1] = (spans[-1][0], spans[-1][1] + gap + 1)
        deltas.append(merged[index] - previous_count)
        previous_count = merged[index]
        previous_index = index
    return scale - shift, spans, deltas


def classic_buckets(point: Any, bounds: Sequence[float] | None) -> list[tuple[float, int]]:
    """Cumulative (upper bound, count) classic buckets derived from an exponential point.

    Exact at every bound that is also an exponential boundary (any power of two, at scale ≥ 0);
    elsewhere the exponential bucket straddling the bound is split log-linearly, so a classic
    count is off by at most part of one exponential bucket (≤ 2^(1/2^scale) wide: 2–9 %),
    far inside the classic bucket's own width. ``bounds=None`` (a histogram we do not know)
    uses powers of two over the observed range, which are always exact. Ends with ``+Inf``.
    """
    scale = point.scale
    positive = point.positive
    counts = list(positive.bucket_counts)
    offset = positive.offset
    below_positive = point.zero_count + sum(point.negative.bucket_counts)
    if bounds is None:
        bounds = _power_of_two_bounds(offset, len(counts), scale)
    # prefix[k] = observations in the first k positive buckets
    prefix = [0]
    for c in counts:
        prefix.append(prefix[-1] + c)
    factor = 2.0**scale
    out: list[tuple[float, int]] = []
    for bound in bounds:
        if bound < 0:  # our boundaries are never negative; a negative one gets no split
            cumulative = 0.0
        elif bound == 0:
            cumulative = float(below_positive)
        else:
            position = math.log2(bound) * factor  # bucket i spans (i, i+1] in these units
            nearest = round(position)
            if abs(position - nearest) < 1e-9:
                position = float(nearest)
            k = position - offset  # fractional number of positive buckets lying below the bound
            if k <= 0:
                cumulative = float(below_positive)
            elif k >= len(counts):
                cumulative = float(below_positive + prefix[-1])
            else:
                whole = math.floor(k)
                cumulative = below_positive + prefix[whole] + counts[whole] * (k - whole)
        out.append((float(bound), round(cumulative)))
    out.append((math.inf, int(point.count)))
    return out


def _power_of_two_bounds(offset: int, length: int, scale: int) -> list[float]:
    if length == 0:
        return []
    low = math.floor(offset / 2.0**scale)
    high = math.ceil((offset + length) / 2.0**scale)
    return [2.0**e for e in range(low, high + 1)]
