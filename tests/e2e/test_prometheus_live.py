"""Real Prometheus scrapes a real instrumented vLLM run through our exemplar-carrying endpoint.

One run of a few hundred long-tailed requests is scraped by two real Prometheus 2.42 at once:
one with native histograms on (it negotiates the protobuf exposition and stores our exponential
histograms as native histograms) and one without (OpenMetrics text: classic buckets derived
from the exponential ones). The run keeps vLLM's engine stats on: queue time exists only then.

On both: every PromQL expression of the committed dashboards and rules returns data (native
form or its classic fallback), and exemplars lead to real request spans. Native quantiles are
within 10 % of the true quantiles of the request spans; classic ones within their bucket.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Iterator
from typing import Any

import pytest

from otel_rollout.config import DEFAULT_LATENCY_BUCKETS
from testkit.otlp_receiver import OTLPReceiver, attr
from testkit.prometheus import Prometheus, free_port
from testkit.promql import all_promql_expressions
from testkit.workload_runner import REPO, lingering_workload, workload_env

pytestmark = [pytest.mark.vllm, pytest.mark.prometheus]

# Produced by the Collector's spanmetrics connector, which cannot run on these machines (no
# Collector binary); everything else is produced by the package itself.
COLLECTOR_ONLY = re.compile(r"traces_span_metrics_")
COMPARISON = re.compile(r"\s(?:>|<|>=|<=|==|!=)\s")
STEPS, BATCH = 4, 64
NATIVE = "gen_ai_server_request_duration_seconds"


class Run:
    def __init__(
        self, native: Prometheus, classic: Prometheus, truth: list[Any], receiver: OTLPReceiver
    ) -> None:
        self.prom = {"native": native, "classic": classic}
        self.truth = truth
        self.receiver = receiver

    def request_spans(self) -> list[Any]:
        return [
            s for s in self.receiver.spans() if attr(s.attributes, "gen_ai.usage.output_tokens")
        ]

    def durations(self) -> list[float]:
        return sorted(
            (s.end_time_unix_nano - s.start_time_unix_nano) / 1e9 for s in self.request_spans()
        )


@pytest.fixture(scope="module")
def scraped_run(
    tmp_path_factory: pytest.TempPathFactory, tiny_model: str, vllm_module: Any
) -> Iterator[Run]:
    metrics_port = free_port()
    rules = [str(REPO / "prometheus" / "rules.yml")]
    native = Prometheus(
        tmp_path_factory.mktemp("prom-native"), metrics_port, native=True, rule_files=rules
    )
    classic = Prometheus(
        tmp_path_factory.mktemp("prom-classic"), metrics_port, native=False, rule_files=rules
    )
    receiver = OTLPReceiver().start()
    env = workload_env(
        OTEL_TRACES_EXPORTER="otlp",
        OTEL_METRICS_EXPORTER="rollout_prometheus",
        OTEL_EXPORTER_OTLP_ENDPOINT=receiver.grpc_endpoint,
        OTEL_EXPORTER_PROMETHEUS_HOST="127.0.0.1",
        OTEL_EXPORTER_PROMETHEUS_PORT=str(metrics_port),
        # The quantiles are checked against every request span: keep them all.
        OTEL_ROLLOUT_SAMPLE_RATE="1",
    )
    workload = lingering_workload(
        tiny_model,
        env,
        "--steps",
        str(STEPS),
        "--batch",
        str(BATCH),
        "--engine-stats",
        "--phases",  # the dashboard's phase panel must have data too
        "--weight-sync",  # and its weight-sync, engine-time and staleness panels
        "--agents",  # and its trajectory row
        "2",
        "--replicas",  # and the replica spread (each agent on an engine of its own)
        "2",
    )
    try:
        with workload as truth:
            receiver.wait_for(
                lambda r: (
                    sum(1 for s in r.spans() if attr(s.attributes, "gen_ai.usage.output_tokens"))
                    == len(truth)
                )
            )
            native.wait_for(f"histogram_count(sum({NATIVE})) == {len(truth)}")
            classic.wait_for(f'sum({NATIVE}_bucket{{le="+Inf"}}) == {len(truth)}')
            # Let rules evaluate and rate windows fill: several scrapes after the last request.
            time.sleep(6)
            yield Run(native, classic, truth, receiver)
    finally:
        receiver.stop()
        native.stop()
        classic.stop()


def _evaluable(source: str, expr: str) -> str:
    """Alerts return series only while firing; their condition's left side must have data."""
    if source.split(": ")[-1].startswith("alert") or " alert " in source:
        left = COMPARISON.split(expr, maxsplit=1)[0]
        return re.sub(r"\s+offset\s+\S+", "", left).strip().lstrip("(")
    return expr


@pytest.mark.parametrize("kind", ["native", "classic"])
def test_every_dashboard_and_rule_expression_returns_data(scraped_run: Run, kind: str) -> None:
    prom = scraped_run.prom[kind]
    assert len(scraped_run.truth) == STEPS * BATCH
    empty = []
    checked = 0
    for source, expr in all_promql_expressions(REPO):
        if COLLECTOR_ONLY.search(expr):
            continue
        query = _evaluable(source, expr)
        result = prom.query(query)
        checked += 1
        values = [r["value"][1] for r in result if "value" in r]
        if not result or (values and all(math.isnan(float(v)) for v in values)):
            empty.append(f"{source}: {query}")
    assert checked >= 30
    assert not empty, f"{kind}: expressions without data:\n" + "\n".join(empty)


def test_each_prometheus_stores_the_form_it_asked_for(scraped_run: Run) -> None:
    native, classic = scraped_run.prom["native"], scraped_run.prom["classic"]
    (series,) = native.query(f"sum({NATIVE})")
    assert "histogram" in series and not native.query(f"{NATIVE}_bucket")
    assert classic.query(f"{NATIVE}_bucket") and not classic.query(NATIVE)


def test_native_quantiles_within_ten_percent_of_the_request_spans(scraped_run: Run) -> None:
    durations = scraped_run.durations()
    assert len(durations) == STEPS * BATCH
    report = []
    for q in (0.5, 0.9, 0.99):
        true = durations[math.ceil(q * len(durations)) - 1]
        native = scraped_run.prom["native"].scalar(f"histogram_quantile({q}, sum({NATIVE}))")
        classic = scraped_run.prom["classic"].scalar(
            f"histogram_quantile({q}, sum by (le) ({NATIVE}_bucket))"
        )
        report.append(
            f"p{round(q * 100)}: spans {true:.4f}s native {native:.4f}s "
            f"({(native - true) / true:+.1%}) classic {classic:.4f}s "
            f"({(classic - true) / true:+.1%})"
        )
        assert abs(native - true) / true <= 0.10, report
    print("\n".join(report))


def test_classic_p99_within_one_bucket(scraped_run: Run) -> None:
    durations = scraped_run.durations()
    true_p99 = durations[math.ceil(0.99 * len(durations)) - 1]
    estimate = scraped_run.prom["classic"].scalar(
        f"histogram_quantile(0.99, sum by (le) ({NATIVE}_bucket))"
    )
    bounds = [0.0, *DEFAULT_LATENCY_BUCKETS]
    index = next(i for i, b in enumerate(bounds) if true_p99 <= b)
    low, high = bounds[max(0, index - 2)], bounds[min(len(bounds) - 1, index + 1)]
    assert low <= estimate <= high, (true_p99, estimate)


@pytest.mark.parametrize("kind, selector", [("native", NATIVE), ("classic", f"{NATIVE}_bucket")])
def test_exemplars_point_at_real_request_spans(scraped_run: Run, kind: str, selector: str) -> None:
    exemplars = scraped_run.prom[kind].exemplars(selector)
    trace_ids = {ex["labels"]["trace_id"] for ex in exemplars}
    span_ids = {ex["labels"]["span_id"] for ex in exemplars}
    requests = scraped_run.request_spans()
    assert trace_ids and span_ids
    assert span_ids <= {s.span_id.hex() for s in requests}
    assert trace_ids <= {s.trace_id.hex() for s in requests}
