"""Exponential histograms: which instruments get them, and how our endpoint serves them.

The protobuf exposition is decoded here with protobuf's own runtime from a descriptor written out
of Prometheus' client_model ``metrics.proto`` — an independent decoder, not our encoder read back.
Bucket contents are checked against the raw recorded values, never against constants.
"""

from __future__ import annotations

import dataclasses
import math
import random
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import (
    ExponentialHistogram,
    InMemoryMetricReader,
)
from opentelemetry.sdk.metrics.export import Histogram as HistogramData
from opentelemetry.sdk.metrics.view import ExponentialBucketHistogramAggregation, View
from opentelemetry.sdk.trace import TracerProvider

from otel_rollout import histograms
from otel_rollout.config import RolloutConfig, load_config
from otel_rollout.exposition import (
    PROTOBUF_CONTENT_TYPE,
    OpenMetricsExemplarReader,
    wants_protobuf,
)
from otel_rollout.telemetry import Telemetry
from testkit.records import make_record

# --- an independent decoder for io.prometheus.client (client_model metrics.proto, proto2) --------

_D, _I64, _U64, _I32, _STR, _MSG, _U32, _S32, _S64 = 1, 3, 4, 5, 9, 11, 13, 17, 18
_OPT, _REP = 1, 3
_SCHEMA: dict[str, list[tuple[str, int, int, int, str]]] = {
    "LabelPair": [("name", 1, _STR, _OPT, ""), ("value", 2, _STR, _OPT, "")],
    "Gauge": [("value", 1, _D, _OPT, "")],
    "Timestamp": [("seconds", 1, _I64, _OPT, ""), ("nanos", 2, _I32, _OPT, "")],
    "Exemplar": [
        ("label", 1, _MSG, _REP, "LabelPair"),
        ("value", 2, _D, _OPT, ""),
        ("timestamp", 3, _MSG, _OPT, "Timestamp"),
    ],
    "Counter": [("value", 1, _D, _OPT, ""), ("exemplar", 2, _MSG, _OPT, "Exemplar")],
    "Bucket": [
        ("cumulative_count", 1, _U64, _OPT, ""),
        ("upper_bound", 2, _D, _OPT, ""),
        ("exemplar", 3, _MSG, _OPT, "Exemplar"),
        ("cumulative_count_float", 4, _D, _OPT, ""),
    ],
    "BucketSpan": [("offset", 1, _S32, _OPT, ""), ("length", 2, _U32, _OPT, "")],
    "Histogram": [
        ("sample_count", 1, _U64, _OPT, ""),
        ("sample_sum", 2, _D, _OPT, ""),
        ("bucket", 3, _MSG, _REP, "Bucket"),
        ("sample_count_float", 4, _D, _OPT, ""),
        ("schema", 5, _S32, _OPT, ""),
        ("zero_threshold", 6, _D, _OPT, ""),
        ("zero_count", 7, _U64, _OPT, ""),
        ("zero_count_float", 8, _D, _OPT, ""),
        ("negative_span", 9, _MSG, _REP, "BucketSpan"),
        ("negative_delta", 10, _S64, _REP, ""),
        ("negative_count", 11, _D, _REP, ""),
        ("positive_span", 12, _MSG, _REP, "BucketSpan"),
        ("positive_delta", 13, _S64, _REP, ""),
        ("positive_count", 14, _D, _REP, ""),
        ("exemplars", 16, _MSG, _REP, "Exemplar"),
    ],
    "Metric": [
        ("label", 1, _MSG, _REP, "LabelPair"),
        ("gauge", 2, _MSG, _OPT, "Gauge"),
        ("counter", 3, _MSG, _OPT, "Counter"),
        ("timestamp_ms", 6, _I64, _OPT, ""),
        ("histogram", 7, _MSG, _OPT, "Histogram"),
    ],
    "MetricFamily": [
        ("name", 1, _STR, _OPT, ""),
        ("help", 2, _STR, _OPT, ""),
        ("type", 3, _I32, _OPT, ""),
        ("metric", 4, _MSG, _REP, "Metric"),
    ],
}


@pytest.fixture(scope="module")
def metric_family() -> Any:
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    proto = descriptor_pb2.FileDescriptorProto(
        name="otel_rollout_test_metrics.proto", package="io.prometheus.client", syntax="proto2"
    )
    for message, fields in _SCHEMA.items():
        m = proto.message_type.add(name=message)
        for name, number, kind, label, type_name in fields:
            f = m.field.add(name=name, number=number, type=kind, label=label)
            if type_name:
                f.type_name = f".io.prometheus.client.{type_name}"
    pool = descriptor_pool.DescriptorPool()
    pool.Add(proto)
    return message_factory.GetMessageClass(
        pool.FindMessageTypeByName("io.prometheus.client.MetricFamily")
    )


def decode_delimited(body: bytes, cls: Any) -> Iterator[Any]:
    pos = 0
    while pos < len(body):
        size, shift = 0, 0
        while True:
            byte = body[pos]
            pos += 1
            size |= (byte & 0x7F) << shift
            shift += 7
            if not byte & 0x80:
                break
        message = cls()
        message.ParseFromString(body[pos : pos + size])
        pos += size
        yield message


# --- a pipeline under test: our reader on a local MeterProvider ------------------------------------


class Pipeline:
    """Our scrape reader (no server) + a tracer, recording lognormal latencies inside spans."""

    def __init__(self, config: RolloutConfig, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setenv("OTEL_ROLLOUT_HISTOGRAMS", config.histograms)
        self.reader = OpenMetricsExemplarReader(start_server=False)
        self.provider = MeterProvider(metric_readers=[self.reader])
        self.tracer = TracerProvider().get_tracer("test")
        self.meter = self.provider.get_meter("otel_rollout.vllm")
        self.duration = self.meter.create_histogram(
            "gen_ai.server.request.duration",
            unit="s",
            explicit_bucket_boundaries_advisory=config.latency_buckets,
        )
        self.values: list[float] = []
        self.span_ids: set[str] = set()

    def record(self, count: int, seed: int = 7) -> None:
        rng = random.Random(seed)
        for _ in range(count):
            value = rng.lognormvariate(-0.5, 1.2)
            with self.tracer.start_as_current_span("req") as span:
                self.duration.record(value, {"gen_ai.request.model": "m"})
                self.span_ids.add(format(span.get_span_context().span_id, "016x"))
            self.values.append(value)


def _prom_buckets(values: list[float], schema: int) -> dict[int, int]:
    """Prometheus bucket j at schema s holds (2^((j-1)/2^s), 2^(j/2^s)]."""
    out: dict[int, int] = {}
    for v in values:
        j = math.ceil(math.log2(v) * 2**schema)
        out[j] = out.get(j, 0) + 1
    return out


def _spans_to_buckets(spans: Any, deltas: Any) -> dict[int, int]:
    out: dict[int, int] = {}
    index, count, d = 0, 0, iter(deltas)
    for n, span in enumerate(spans):
        index = span.offset if n == 0 else index + span.offset
        for _ in range(span.length):
            count += next(d)
            if count:
                out[index] = count
            index += 1
    return out


def test_protobuf_native_histogram_matches_the_recorded_values(
    metric_family: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    pipe = Pipeline(RolloutConfig(), monkeypatch)
    pipe.record(400)
    data = pipe.reader.collect_for_scrape()
    body = pipe.reader.protobuf(data)
    families = {f.name: f for f in decode_delimited(body, metric_family)}
    family = families["gen_ai_server_request_duration_seconds"]
    assert family.type == 4  # HISTOGRAM
    (metric,) = family.metric
    h = metric.histogram
    assert h.sample_count == len(pipe.values)
    assert h.sample_sum == pytest.approx(sum(pipe.values))
    assert h.zero_threshold > 0  # marks the message as native for Prometheus 2.4x
    assert -4 <= h.schema <= 8
    assert _spans_to_buckets(h.positive_span, h.positive_delta) == _prom_buckets(
        pipe.values, h.schema
    )
    # classic buckets beside the native ones: cumulative, +Inf = count, exact at powers of two
    bounds = [b.upper_bound for b in h.bucket]
    counts = [b.cumulative_count for b in h.bucket]
    assert bounds == [*RolloutConfig().latency_buckets, math.inf]
    assert counts == sorted(counts) and counts[-1] == len(pipe.values)
    for bound, cumulative in zip(bounds, counts, strict=False):
        exact = sum(1 for v in pipe.values if v <= bound)
        if math.isinf(bound) or math.log2(bound).is_integer():
            assert cumulative == exact, bound
        else:  # split inside one exponential bucket: off by at most that bucket's count
            width = 2 ** (2**-h.schema)
            straddling = sum(1 for v in pipe.values if bound / width < v <= bound * width)
            assert abs(cumulative - exact) <= straddling, bound
    # exemplars: all of them, time-ordered, on the native message; the slowest on its bucket
    native = list(h.exemplars)
    assert native and all(e.HasField("timestamp") for e in native)
    times = [e.timestamp.seconds + e.timestamp.nanos / 1e9 for e in native]
    assert times == sorted(times)
    assert {{lp.name: lp.value for lp in e.label}["span_id"] for e in native} <= pipe.span_ids
    on_buckets = [b.exemplar for b in h.bucket if b.HasField("exemplar")]
    assert [e.value for e in on_buckets] == [max(e.value for e in native)]


def test_protobuf_downscales_above_prometheus_schema_8(
    metric_family: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The SDK may run at scale 20; Prometheus stores at most schema 8: buckets merge exactly."""
    reader = OpenMetricsExemplarReader(start_server=False)
    provider = MeterProvider(
        metric_readers=[reader],
        views=[
            View(
                instrument_name="fine",
                aggregation=ExponentialBucketHistogramAggregation(max_scale=20),
            )
        ],
    )
    hist = provider.get_meter("x").create_histogram("fine", unit="s")
    values = [1.0001 + i * 1e-5 for i in range(50)] + [1.01, 1.02]
    for v in values:
        hist.record(v)
    data = reader.collect_for_scrape()
    point = data.resource_metrics[0].scope_metrics[0].metrics[0].data.data_points[0]
    assert point.scale > 8
    (family,) = [
        f
        for f in decode_delimited(reader.protobuf(data), metric_family)
        if f.name == "fine_seconds"
    ]
    h = family.metric[0].histogram
    assert h.schema == 8
    assert _spans_to_buckets(h.positive_span, h.positive_delta) == _prom_buckets(values, 8)


@pytest.mark.parametrize(
    "offset, counts, scale",
    [
        (0, [1, 0, 0, 0, 0, 2], 3),  # a long gap opens a second span
        (-5, [3, 0, 4, 0, 0, 1], 2),  # short gaps stay inside one span as empty buckets
        (10, [], 0),
    ],
)
def test_native_buckets_spans_and_deltas(offset: int, counts: list[int], scale: int) -> None:
    schema, spans, deltas = histograms.native_buckets(offset, counts, scale)
    assert schema == scale
    rebuilt: dict[int, int] = {}
    index, running, it = 0, 0, iter(deltas)
    for n, (off, length) in enumerate(spans):
        index = off if n == 0 else index + off
        for _ in range(length):
            running += next(it)
            if running:
                rebuilt[index] = running
            index += 1
    expected = {offset + i + 1: c for i, c in enumerate(counts) if c}
    assert rebuilt == expected
    assert sum(length for _, length in spans) == len(deltas)


def test_text_scrape_gets_classic_buckets_with_exemplars(monkeypatch: pytest.MonkeyPatch) -> None:
    from prometheus_client.openmetrics.parser import text_string_to_metric_families

    pipe = Pipeline(RolloutConfig(), monkeypatch)
    pipe.record(200)
    pipe.reader._serve("127.0.0.1", 0)
    try:
        req = urllib.request.Request(
            f"http://127.0.0.1:{pipe.reader.port}/metrics",
            headers={"Accept": "application/openmetrics-text; version=1.0.0; charset=utf-8"},
        )
        with urllib.request.urlopen(req, timeout=10) as resp:
            assert resp.headers["Content-Type"].startswith("application/openmetrics-text")
            text = resp.read().decode()
    finally:
        pipe.reader.shutdown()
    (family,) = [
        f
        for f in text_string_to_metric_families(text)
        if f.name == "gen_ai_server_request_duration_seconds"
    ]
    buckets = [s for s in family.samples if s.name.endswith("_bucket")]
    assert float(buckets[-1].value) == len(pipe.values)
    assert buckets[-1].labels["le"] == "+Inf"
    exemplars = [s.exemplar for s in buckets if s.exemplar]
    assert exemplars and {e.labels["span_id"] for e in exemplars} <= pipe.span_ids


def test_served_protobuf_only_to_scrapers_that_prefer_it(
    monkeypatch: pytest.MonkeyPatch, metric_family: Any
) -> None:
    pipe = Pipeline(RolloutConfig(), monkeypatch)
    pipe.record(20)
    pipe.reader._serve("127.0.0.1", 0)
    try:
        req = urllib.request.Request(
            f"http://127.0.0.1:{pipe.reader.port}/metrics",
            headers={
                "Accept": "application/vnd.google.protobuf;"
                "proto=io.prometheus.client.MetricFamily;encoding=delimited,"
                "text/plain;version=0.0.4;q=0.5",
                "Accept-Encoding": "gzip",
            },
        )
        with urllib.request.urlopen(req, timeout=10) as resp:
            assert resp.headers["Content-Type"] == PROTOBUF_CONTENT_TYPE
            import gzip

            body = gzip.decompress(resp.read())
    finally:
        pipe.reader.shutdown()
    assert "gen_ai_server_request_duration_seconds" in {
        f.name for f in decode_delimited(body, metric_family)
    }


@pytest.mark.parametrize(
    "accept, expected",
    [
        (
            (
                "application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;encoding=delimited,"
                "application/openmetrics-text;version=1.0.0;q=0.8,text/plain;version=0.0.4;q=0.5,*/*;q=0.1"
            ),
            True,
        ),
        (
            (
                "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;"
                "q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1"
            ),
            False,
        ),
        (
            "application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;encoding=text",
            False,
        ),
        (
            (
                "application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;encoding=delimited;"
                "q=0.3,text/plain;q=0.9"
            ),
            False,
        ),
        ("", False),
    ],
)
def test_wants_protobuf(accept: str, expected: bool) -> None:
    assert wants_protobuf(accept) is expected


# --- which instruments become exponential ----------------------------------------------------------


def _kinds(reader: InMemoryMetricReader) -> dict[tuple[str, str], type]:
    data = reader.get_metrics_data()
    return {
        (sm.scope.name, m.name): type(m.data)
        for rm in data.resource_metrics
        for sm in rm.scope_metrics
        for m in sm.metrics
    }


@pytest.mark.parametrize("route", ["views", "reader"])
def test_only_our_long_tail_instruments_become_exponential(route: str) -> None:
    config = load_config({})
    reader = (
        InMemoryMetricReader()
        if route == "views"
        else InMemoryMetricReader(preferred_aggregation=histograms.reader_aggregation(config))
    )
    provider = MeterProvider(
        metric_readers=[reader], views=histograms.views(config) if route == "views" else ()
    )
    # one engine in each GenAI convention: the token histograms differ by name
    for scope, latest in (("otel_rollout.vllm", False), ("otel_rollout.sglang", True)):
        Telemetry(
            "vllm",
            TracerProvider().get_tracer("t"),
            provider.get_meter(scope),
            dataclasses.replace(config, gen_ai_latest=latest),
        ).emit(make_record("m"))
    provider.force_flush()  # the SDK's own flush: it waits for the background emitter
    provider.get_meter("another.library").create_histogram("gen_ai.client.token.usage").record(5)
    provider.get_meter("otel_rollout").create_histogram("rollout.step.duration").record(3)
    kinds = _kinds(reader)
    ours = {
        key
        for key in kinds
        if key[0].startswith("otel_rollout.") and key[1] in histograms.EXPONENTIAL_INSTRUMENTS
    }
    assert {name for _, name in ours} == set(histograms.EXPONENTIAL_INSTRUMENTS)
    assert {kinds[k] for k in ours} == {ExponentialHistogram}
    assert kinds[("another.library", "gen_ai.client.token.usage")] is HistogramData
    assert kinds[("otel_rollout", "rollout.step.duration")] is HistogramData


def test_explicit_setting_keeps_explicit_buckets_everywhere() -> None:
    config = load_config({"OTEL_ROLLOUT_HISTOGRAMS": "explicit"})
    assert histograms.views(config) == []
    assert histograms.reader_aggregation(config) == {}
    assert histograms.otlp_environment(config) == {}
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    Telemetry(
        "vllm", TracerProvider().get_tracer("t"), provider.get_meter("otel_rollout.vllm"), config
    ).emit(make_record("m"))
    provider.force_flush()
    kinds = set(_kinds(reader).values())
    assert HistogramData in kinds and ExponentialHistogram not in kinds


def test_exponential_keeps_an_exemplar_per_classic_bucket(monkeypatch: pytest.MonkeyPatch) -> None:
    """The aligned reservoir keeps the slow bucket's exemplar; the SDK's would keep 20 at random."""
    pipe = Pipeline(RolloutConfig(), monkeypatch)
    pipe.record(2000)
    point = (
        pipe.reader.collect_for_scrape()
        .resource_metrics[0]
        .scope_metrics[0]
        .metrics[0]
        .data.data_points[0]
    )
    bounds = [*RolloutConfig().latency_buckets, math.inf]
    occupied = {next(i for i, b in enumerate(bounds) if v <= b) for v in pipe.values}
    assert len(point.exemplars) == len(occupied)
    assert max(e.value for e in point.exemplars) > sorted(pipe.values)[-len(pipe.values) // 100]


def test_every_scraper_gets_the_exemplars(
    metric_family: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each scrape collects, and the SDK hands an exemplar to one collection only: an HA pair
    (or a native and a classic Prometheus) must still both see it."""
    pipe = Pipeline(RolloutConfig(), monkeypatch)
    pipe.record(50)

    def scrape() -> set[str]:
        body = pipe.reader.protobuf(pipe.reader.collect_for_scrape())
        (family,) = [
            f
            for f in decode_delimited(body, metric_family)
            if f.name == "gen_ai_server_request_duration_seconds"
        ]
        return {
            lp.value
            for e in family.metric[0].histogram.exemplars
            for lp in e.label
            if lp.name == "span_id"
        }

    first, second = scrape(), scrape()
    assert first and first == second and first <= pipe.span_ids
    pipe.record(1, seed=99)  # a newer request replaces its bucket's exemplar, for everyone
    third = scrape()
    assert third - second and len(third) == len(second)


@pytest.mark.parametrize("route", ["environment", "views"])
def test_otlp_carries_exponential_histograms_with_exemplars(
    route: str, otlp_receiver: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Over real OTLP: the standard variable (zero-code) or our views (own MeterProvider)."""
    from opentelemetry.exporter.otlp.proto.http.metric_exporter import (
        OTLPMetricExporter,
    )
    from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader

    config = load_config({})
    if route == "environment":
        for key, value in histograms.otlp_environment(config).items():
            monkeypatch.setenv(key, value)
    exporter = OTLPMetricExporter(endpoint=f"{otlp_receiver.http_endpoint}/v1/metrics")
    reader = PeriodicExportingMetricReader(exporter, export_interval_millis=3_600_000)
    provider = MeterProvider(
        metric_readers=[reader], views=histograms.views(config) if route == "views" else ()
    )
    tracer = TracerProvider().get_tracer("t")
    telemetry = Telemetry("vllm", tracer, provider.get_meter("otel_rollout.vllm"), config)
    with tracer.start_as_current_span("step") as parent:
        telemetry.emit(make_record("m"))
    provider.shutdown()  # exports once
    assert otlp_receiver.wait_for(
        lambda r: any(m.name == "gen_ai.server.request.duration" for m in r.metrics())
    )
    (metric,) = [m for m in otlp_receiver.metrics() if m.name == "gen_ai.server.request.duration"]
    assert metric.WhichOneof("data") == "exponential_histogram"
    (point,) = metric.exponential_histogram.data_points
    assert point.count == 1 and point.sum == pytest.approx(2.75)
    (exemplar,) = point.exemplars
    assert exemplar.trace_id == parent.get_span_context().trace_id.to_bytes(16, "big")


def test_a_metric_that_fails_to_encode_is_left_out_not_the_scrape(
    metric_family: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    pipe = Pipeline(RolloutConfig(), monkeypatch)
    pipe.record(5)
    pipe.meter.create_counter("rollout.other", unit="s").add(2)

    def broken(point: Any) -> bytes:  # a fault in our encoder, which real data cannot produce
        raise RuntimeError("boom")

    monkeypatch.setattr("otel_rollout.exposition.protobuf.native", broken)
    for _ in range(2):
        names = {
            f.name
            for f in decode_delimited(
                pipe.reader.protobuf(pipe.reader.collect_for_scrape()), metric_family
            )
        }
        assert "rollout_other_seconds_total" in names
        assert "gen_ai_server_request_duration_seconds" not in names
    assert (
        len([r for r in caplog.records if "gen_ai.server.request.duration" in r.getMessage()]) == 1
    )


@pytest.mark.parametrize("fmt", ["text", "protobuf"])
def test_one_metric_that_fails_to_render_leaves_the_rest_of_the_scrape(
    fmt: str, monkeypatch: pytest.MonkeyPatch, metric_family: Any
) -> None:
    """Fault injection (named as such): the histogram's rendering raises; the counter beside it
    must still be served, in both the text and the protobuf exposition."""
    pipe = Pipeline(RolloutConfig(), monkeypatch)
    pipe.record(10)
    pipe.meter.create_counter("rollout.other", unit="{record}").add(3)
    broken = "gen_ai.server.request.duration"

    def explode(metric: Any, *args: Any, **kwargs: Any) -> Any:
        if metric.name == broken:
            raise ValueError("injected rendering fault")
        return original(metric, *args, **kwargs)

    original = pipe.reader._family if fmt == "text" else pipe.reader._family_pb
    monkeypatch.setattr(pipe.reader, "_family" if fmt == "text" else "_family_pb", explode)
    data = pipe.reader.collect_for_scrape()
    if fmt == "text":
        names = {getattr(f, "name", "") for f in pipe.reader.families(data)}
    else:
        names = {f.name for f in decode_delimited(pipe.reader.protobuf(data), metric_family)}
    assert any(n.startswith("rollout_other") for n in names), names
    assert not any(n.startswith("gen_ai_server_request_duration") for n in names)
