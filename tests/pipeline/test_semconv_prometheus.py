"""The dashboards' and rules' token queries answer on real Prometheus in either GenAI convention.

Requests are recorded by our own ``Telemetry`` (hand-built records, no engine: the e2e suite
runs the dashboards on a real vLLM run in the default convention), once with the default names
and once with ``OTEL_SEMCONV_STABILITY_OPT_IN=gen_ai_latest_experimental``, and served by our
scrape endpoint to two real Prometheus 2.42 at once: native histograms on, and off (classic).
Every shipped PromQL expression over token figures must return data in both conventions, the
newest conventions' counters and histograms must carry the exact token totals, and their
exemplars must name the request spans.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.trace import TracerProvider

from otel_rollout.config import RolloutConfig
from otel_rollout.exposition import OpenMetricsExemplarReader
from otel_rollout.exposition.server import start_server
from otel_rollout.record import RequestRecord
from otel_rollout.telemetry import Telemetry
from testkit.prometheus import Prometheus
from testkit.promql import all_promql_expressions
from testkit.records import make_record

pytestmark = pytest.mark.prometheus

REPO = Path(__file__).resolve().parents[2]
TOKEN_QUERY = re.compile(r"gen_ai_client_(?:token_usage|inference_)")
ROUND = 40
DURATION = "gen_ai_server_request_duration_seconds"


class Served:
    """Our telemetry in one convention, behind our scrape endpoint, scraped by two Prometheus."""

    def __init__(self, tmp: Path, latest: bool) -> None:
        self.reader = OpenMetricsExemplarReader(host="127.0.0.1", port=0, start_server=False)
        self.server = start_server("127.0.0.1", 0, self.reader.wsgi_app())
        self.meter_provider = MeterProvider(metric_readers=[self.reader])
        self.telemetry = Telemetry(
            "vllm",
            TracerProvider().get_tracer("otel_rollout.vllm"),
            self.meter_provider.get_meter("otel_rollout.vllm"),
            RolloutConfig(gen_ai_latest=latest, emit_queue=0),
        )
        self.records: list[RequestRecord] = []
        self.record_round(0)  # some before the first scrape, some after: rates see an increase
        port = self.server.server_port
        self.prom = {
            "native": Prometheus(tmp / "native", port, native=True),
            "classic": Prometheus(tmp / "classic", port, native=False),
        }
        self.wait_for_count(ROUND)
        self.record_round(1)
        self.wait_for_count(len(self.records))
        time.sleep(3)  # a few more scrapes after the last request: rate windows have samples

    def wait_for_count(self, n: int) -> None:
        self.prom["native"].wait_for(f"histogram_count(sum({DURATION})) == {n}")
        self.prom["classic"].wait_for(f'sum({DURATION}_bucket{{le="+Inf"}}) == {n}')

    def record_round(self, n: int) -> None:
        for i in range(ROUND):
            record = make_record(
                "tiny",
                request_id=f"r{n}-{i}",
                prompt_tokens=20 + i,
                output_tokens=1 + (i * 7 + n) % 300,  # a long tail of lengths
                cached_tokens=i % 8,
                finish_reasons=("stop",),
            )
            self.telemetry.emit(record)
            self.records.append(record)

    def close(self) -> None:
        for prom in self.prom.values():
            prom.stop()
        self.server.shutdown()
        self.server.server_close()
        self.meter_provider.shutdown()


@pytest.fixture(scope="module", params=["default", "latest"])
def served(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Served]:
    (tmp := tmp_path_factory.mktemp(f"semconv-{request.param}"))
    (tmp / "native").mkdir()
    (tmp / "classic").mkdir()
    s = Served(tmp, latest=request.param == "latest")
    try:
        yield s
    finally:
        s.close()


def _token_expressions() -> list[tuple[str, str]]:
    found = [(src, e) for src, e in all_promql_expressions(REPO) if TOKEN_QUERY.search(e)]
    assert len(found) >= 2, "the dashboards' token panels are gone or renamed"
    return found


@pytest.mark.parametrize("kind", ["native", "classic"])
def test_every_token_query_returns_data_in_either_convention(served: Served, kind: str) -> None:
    prom = served.prom[kind]
    empty = []
    for source, expr in _token_expressions():
        result = prom.query(expr)
        values = [float(r["value"][1]) for r in result if "value" in r]
        if not result or (values and all(math.isnan(v) for v in values)):
            empty.append(f"{source}: {expr}")
    assert not empty, f"{kind}: token queries without data:\n" + "\n".join(empty)


@pytest.mark.parametrize("kind", ["native", "classic"])
def test_throughput_panel_names_input_and_output(served: Served, kind: str) -> None:
    (expr,) = [e for src, e in _token_expressions() if "Throughput" in src]
    result = served.prom[kind].query(expr)
    assert {r["metric"].get("gen_ai_token_type") for r in result} == {"input", "output"}
    assert all(float(r["value"][1]) > 0 for r in result)


def test_each_convention_exposes_only_its_own_names(served: Served) -> None:
    latest = served.telemetry.config.gen_ai_latest
    classic = served.prom["classic"]
    has_default = bool(classic.query("gen_ai_client_token_usage_count"))
    has_latest = bool(classic.query("gen_ai_client_inference_operation_output_tokens_count"))
    assert (has_default, has_latest) == (not latest, latest)


def test_latest_totals_are_exact_and_exemplars_name_the_spans(served: Served) -> None:
    if not served.telemetry.config.gen_ai_latest:
        pytest.skip("the newest conventions' instruments only")
    records = served.records
    inputs = sum(r.prompt_tokens or 0 for r in records)
    outputs = sum(r.output_tokens or 0 for r in records)
    cached = sum(r.cached_tokens or 0 for r in records)
    classic, native = served.prom["classic"], served.prom["native"]
    prefix = "gen_ai_client_inference_usage"
    assert classic.scalar(f"sum({prefix}_input_tokens_total)") == inputs
    assert classic.scalar(f"sum({prefix}_output_tokens_total)") == outputs
    assert classic.scalar(f"sum({prefix}_cache_read_input_tokens_total)") == cached
    modality = classic.query(f"{prefix}_output_tokens_total")[0]["metric"]
    assert modality["gen_ai_token_modality"] == "text"
    histogram = "gen_ai_client_inference_operation_output_tokens"
    assert classic.scalar(f"sum({histogram}_sum)") == outputs
    assert native.scalar(f"histogram_sum(sum({histogram}))") == outputs
    assert native.scalar(f"histogram_count(sum({histogram}))") == len(records)
    span_ids = {format(r.span_id, "016x") for r in records if r.span_id}
    assert len(span_ids) == len(records)
    exemplars = classic.exemplars(f"{histogram}_bucket")
    assert exemplars and {e["labels"]["span_id"] for e in exemplars} <= span_ids
