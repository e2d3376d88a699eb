"""Our scrape endpoint names series exactly as the stock ``opentelemetry-exporter-prometheus``
does, so a dashboard finds the same series whichever of the two a job runs.

Both readers are attached to one ``MeterProvider``, the same instruments recorded once, and the
families each hands ``prometheus_client`` are compared: family names and types, sample names,
label names (the stock exporter's ``otel_scope_*`` labels aside: ours keeps the scope in
``target_info``-free series, as before).
"""

from __future__ import annotations

from typing import Any

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import MetricReader
from opentelemetry.sdk.resources import Resource

from otel_rollout.exposition import OpenMetricsExemplarReader, label_name, metric_name
from otel_rollout.exposition.names import UNITS

prometheus = pytest.importorskip("opentelemetry.exporter.prometheus")
client = pytest.importorskip("prometheus_client")

UNITS_TRIED = [
    *UNITS,
    "",
    "{token}",
    "{request}/s",
    "By/s",
    "m/s",
    "1/h",
    "KiBy/mo",
    "tokens per second!",
    "_odd_",
    "foo/{bar}",
]
KEYS = ["gen_ai.request.model", "a-b", "x__y", "rollout.step", "9lives", "ünï"]


def _families(reader: MetricReader, registry: Any) -> dict[str, tuple[str, str, set[Any]]]:
    out = {}
    for family in registry.collect():
        if family.name == "target_info":
            continue
        samples = {
            (s.name, frozenset(k for k in s.labels if not k.startswith("otel_scope_")))
            for s in family.samples
        }
        out[family.name] = (family.type, family.unit, samples)
    return out


def _record(provider: MeterProvider) -> None:
    meter = provider.get_meter("names")
    attrs = {key: "v" for key in KEYS}
    for i, unit in enumerate(UNITS_TRIED):
        meter.create_counter(f"c{i}.total", unit=unit).add(1, attrs)
        meter.create_histogram(f"h{i}.dur", unit=unit).record(0.5, attrs)
        meter.create_up_down_counter(f"u{i}.active", unit=unit).add(-2, attrs)
        meter.create_gauge(f"g{i}.level", unit=unit).set(3, attrs)
    meter.create_counter("already_total", unit="s").add(1)
    meter.create_histogram("dur.seconds", unit="s").record(1.0)
    meter.create_counter("a-b/c..d__e", unit="ms").add(1)


def test_series_names_are_the_stock_exporters() -> None:
    stock_registry = client.CollectorRegistry(auto_describe=False)
    stock = prometheus.PrometheusMetricReader(registry=stock_registry, disable_target_info=True)
    ours = OpenMetricsExemplarReader(start_server=False)
    provider = MeterProvider(
        metric_readers=[stock, ours], resource=Resource.create({"service.name": "t"})
    )
    try:
        _record(provider)
        theirs = _families(stock, stock_registry)
        mine = _families(ours, ours.registry)
        assert sorted(mine) == sorted(theirs)
        for name, expected in theirs.items():
            assert mine[name] == expected, name
        assert len(mine) == 4 * len(UNITS_TRIED) + 3
    finally:
        provider.shutdown()


@pytest.mark.parametrize(
    ("name", "unit", "expected"),
    [
        (
            "gen_ai.server.request.duration",
            "s",
            ("gen_ai_server_request_duration_seconds", "seconds"),
        ),
        ("rollout.step.duration", "s", ("rollout_step_duration_seconds", "seconds")),
        ("gen_ai.client.token.usage", "{token}", ("gen_ai_client_token_usage", "")),
        ("rollout.throughput", "By/s", ("rollout_throughput_bytes_per_second", "bytes_per_second")),
        ("latency_seconds", "s", ("latency_seconds", "seconds")),
        ("ratio", "1", ("ratio", "")),
    ],
)
def test_metric_name(name: str, unit: str, expected: tuple[str, str]) -> None:
    assert metric_name(name, unit) == expected


@pytest.mark.parametrize(
    ("key", "label"),
    [("gen_ai.request.model", "gen_ai_request_model"), ("a-b", "a_b"), ("x..y", "x_y")],
)
def test_label_name(key: str, label: str) -> None:
    assert label_name(key) == label
