"""Real Prometheus 2.42 scrapes our endpoint: native histograms with it on, classic ones without.

No engine here (the vLLM run is tests/e2e/test_prometheus_live.py): latencies spanning five
orders of magnitude are recorded straight into our instrumentation scope, inside real spans, so
the true quantiles are known exactly and the test runs in seconds.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.trace import TracerProvider

from otel_rollout.exposition import OpenMetricsExemplarReader
from testkit.prometheus import Prometheus

pytestmark = pytest.mark.prometheus

NATIVE = "gen_ai_server_request_duration_seconds"
N = 600


class Target:
    """Our reader serving a local MeterProvider; remembers the Accept header of each scrape."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, mode: str = "exponential") -> None:
        monkeypatch.setenv("OTEL_ROLLOUT_HISTOGRAMS", mode)
        self.reader = OpenMetricsExemplarReader(host="127.0.0.1", port=0, start_server=False)
        self.accepts: list[str] = []
        app = self.reader.wsgi_app()

        def spy(environ: dict[str, Any], start_response: Any) -> Any:
            self.accepts.append(environ.get("HTTP_ACCEPT", ""))
            return app(environ, start_response)

        from otel_rollout.exposition.server import start_server

        self.server = start_server("127.0.0.1", 0, spy)
        self.port = self.server.server_port
        self.provider = MeterProvider(metric_readers=[self.reader])
        tracer = TracerProvider().get_tracer("test")
        hist = self.provider.get_meter("otel_rollout.vllm").create_histogram(
            "gen_ai.server.request.duration",
            unit="s",
            explicit_bucket_boundaries_advisory=self.reader.config.latency_buckets,
        )
        rng = random.Random(18)
        self.values: list[float] = []
        self.span_ids: set[str] = set()
        for _ in range(N):
            value = rng.lognormvariate(0.0, 2.5)  # ~1 ms .. ~1000 s
            with tracer.start_as_current_span("request") as span:
                hist.record(value, {"gen_ai.request.model": "tiny"})
                self.span_ids.add(format(span.get_span_context().span_id, "016x"))
            self.values.append(value)

    def true_quantile(self, q: float) -> float:
        ordered = sorted(self.values)
        return ordered[math.ceil(q * len(ordered)) - 1]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def target(monkeypatch: pytest.MonkeyPatch) -> Iterator[Target]:
    t = Target(monkeypatch)
    yield t
    t.close()


def test_native_histograms_give_quantiles_within_one_native_bucket(
    target: Target, tmp_path: Path
) -> None:
    prom = Prometheus(tmp_path, target.port, native=True)
    try:
        prom.wait_for(f"histogram_count(sum({NATIVE})) == {N}")
        assert any("application/vnd.google.protobuf" in a for a in target.accepts)
        assert not prom.query(f"{NATIVE}_bucket"), "2.42 keeps no classic series beside native"
        (series,) = prom.query(NATIVE)
        schema_ratio = _bucket_ratio(series)
        for q in (0.5, 0.9, 0.99):
            true = target.true_quantile(q)
            estimate = prom.scalar(f"histogram_quantile({q}, sum({NATIVE}))")
            # the estimate lies in the native bucket holding the true quantile (or a neighbour
            # when the quantile sits on a bucket edge), and within 10 % (the bar)
            assert true / schema_ratio**2 <= estimate <= true * schema_ratio**2, (q, true, estimate)
            assert abs(estimate - true) / true <= 0.10, (q, true, estimate)
        exemplars = prom.exemplars(NATIVE)
        assert exemplars, "a native histogram's exemplar rides on its classic buckets in 2.42"
        assert {e["labels"]["span_id"] for e in exemplars} <= target.span_ids
        # the one exemplar 2.42 stores per scrape is the slowest request of the interval
        assert max(float(e["value"]) for e in exemplars) == pytest.approx(max(target.values))
    finally:
        prom.stop()


def test_text_only_scrape_still_gets_classic_buckets_and_exemplars(
    target: Target, tmp_path: Path
) -> None:
    prom = Prometheus(tmp_path, target.port, native=False)
    try:
        prom.wait_for(f'{NATIVE}_bucket{{le="+Inf"}} == {N}')
        assert target.accepts and not any("protobuf" in a for a in target.accepts)
        assert not prom.query(NATIVE)
        exemplars = prom.exemplars(f"{NATIVE}_bucket")
        assert exemplars and {e["labels"]["span_id"] for e in exemplars} <= target.span_ids
        # the dashboards' fallback form answers from the classic series
        fallback = prom.scalar(
            f"histogram_quantile(0.5, sum({NATIVE})) or "
            f"histogram_quantile(0.5, sum by (le) ({NATIVE}_bucket))"
        )
        assert fallback > 0
        # classic buckets derived from the exponential ones are exact at powers of two
        for le in (0.5, 1, 2):
            count = prom.scalar(f'sum({NATIVE}_bucket{{le="{float(le)}"}})')
            assert count == sum(1 for v in target.values if v <= le)
    finally:
        prom.stop()


def test_explicit_setting_serves_classic_histograms_in_protobuf(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """OTEL_ROLLOUT_HISTOGRAMS=explicit under a native-histogram Prometheus: classic series
    (protobuf Histogram without native fields), exemplars on the buckets, fallback queries."""
    target = Target(monkeypatch, mode="explicit")
    prom = Prometheus(tmp_path, target.port, native=True)
    try:
        prom.wait_for(f'{NATIVE}_bucket{{le="+Inf"}} == {N}')
        assert any("application/vnd.google.protobuf" in a for a in target.accepts)
        assert not prom.query(NATIVE)
        exemplars = prom.exemplars(f"{NATIVE}_bucket")
        assert exemplars and {e["labels"]["span_id"] for e in exemplars} <= target.span_ids
        assert (
            prom.scalar(
                f"histogram_quantile(0.99, sum({NATIVE})) or "
                f"histogram_quantile(0.99, sum by (le) ({NATIVE}_bucket))"
            )
            > 0
        )
    finally:
        prom.stop()
        target.close()


def _bucket_ratio(series: dict[str, Any]) -> float:
    """Width ratio of the native buckets Prometheus returned (upper / lower of a bucket)."""
    _, hist = series["histogram"]
    ratios = [float(b[2]) / float(b[1]) for b in hist["buckets"] if float(b[1]) > 0]
    return max(ratios)
