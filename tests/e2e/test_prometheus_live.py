"""Real Prometheus scrapes a real instrumented vLLM run through our exemplar-carrying endpoint.

The run keeps vLLM's engine stats on: queue time exists only then (README, timing table).

Every PromQL expression in the committed dashboards and rules is executed and must return data;
``histogram_quantile`` agrees with the true p99; exemplars lead to real request spans.
"""

from __future__ import annotations

import json
import math
import re
import shutil
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from otel_rollout.config import DEFAULT_LATENCY_BUCKETS
from tests.e2e.runner import REPO, instrument_command, workload_env
from tests.pipeline.promql import all_promql_expressions
from testkit.otlp_receiver import OTLPReceiver, attr

pytestmark = [pytest.mark.vllm, pytest.mark.prometheus]

# Produced by the Collector's spanmetrics connector, which cannot run on these machines (no
# Collector binary); everything else is produced by the package itself.
COLLECTOR_ONLY = re.compile(r"traces_span_metrics_")
COMPARISON = re.compile(r"\s(?:>|<|>=|<=|==|!=)\s")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Prometheus:
    def __init__(self, tmp: Path, target_port: int) -> None:
        binary = shutil.which("prometheus")
        if binary is None:
            pytest.fail("prometheus not found: apt-get install -y --no-install-recommends prometheus")
        self.port = _free_port()
        config = tmp / "prometheus.yml"
        config.write_text(json.dumps({
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(REPO / "collector" / "prometheus" / "rules.yml")],
            "scrape_configs": [{"job_name": "rollout-e2e",
                                "static_configs": [{"targets": [f"127.0.0.1:{target_port}"]}]}],
        }))
        self.proc = subprocess.Popen(
            [binary, f"--config.file={config}", f"--storage.tsdb.path={tmp / 'tsdb'}",
             f"--web.listen-address=127.0.0.1:{self.port}",
             "--enable-feature=exemplar-storage"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def api(self, path: str, **params: Any) -> Any:
        url = f"http://127.0.0.1:{self.port}/api/v1/{path}?{urllib.parse.urlencode(params)}"
        with urllib.request.urlopen(url, timeout=10) as resp:
            body = json.load(resp)
        assert body["status"] == "success", body
        return body["data"]

    def query(self, expr: str) -> list[Any]:
        return list(self.api("query", query=expr)["result"])

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=10)


@pytest.fixture(scope="module")
def scraped_run(tmp_path_factory: pytest.TempPathFactory, tiny_model: str,
                vllm_module: Any) -> Iterator[tuple[Prometheus, list[Any], OTLPReceiver]]:
    tmp = tmp_path_factory.mktemp("prom")
    metrics_port = _free_port()
    prom = Prometheus(tmp, metrics_port)
    receiver = OTLPReceiver().start()
    env = workload_env(OTEL_TRACES_EXPORTER="otlp", OTEL_METRICS_EXPORTER="rollout_prometheus",
                       OTEL_EXPORTER_OTLP_ENDPOINT=receiver.grpc_endpoint,
                       OTEL_EXPORTER_PROMETHEUS_HOST="127.0.0.1",
                       OTEL_EXPORTER_PROMETHEUS_PORT=str(metrics_port))
    proc = subprocess.Popen(instrument_command("--model", tiny_model, "--steps", "4",
                                               "--batch", "24", "--linger",
                                               "--engine-stats"),
                            env=env, cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True)
    truth: list[Any] = []
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.startswith("{"):
                truth.append(json.loads(line))
            if line.strip() == "DONE":
                break
        assert proc.poll() is None, "workload exited before lingering"
        # Let rules evaluate and rate windows fill: several scrapes after the last request.
        time.sleep(6)
        receiver.wait_for(lambda r: sum(1 for s in r.spans()
                                        if attr(s.attributes, "gen_ai.usage.output_tokens")) == len(truth))
        yield prom, truth, receiver
    finally:
        if proc.stdin:
            proc.stdin.close()
        proc.wait(timeout=60)
        receiver.stop()
        prom.stop()


def _evaluable(source: str, expr: str) -> str:
    """Alerts return series only while firing; their condition's left side must have data."""
    if source.split(": ")[-1].startswith("alert") or " alert " in source:
        left = COMPARISON.split(expr, maxsplit=1)[0]
        return re.sub(r"\s+offset\s+\S+", "", left).strip().lstrip("(")
    return expr


def test_every_dashboard_and_rule_expression_returns_data(scraped_run: Any) -> None:
    prom, truth, _ = scraped_run
    assert len(truth) == 96
    empty = []
    checked = 0
    for source, expr in all_promql_expressions(REPO):
        if COLLECTOR_ONLY.search(expr):
            continue
        query = _evaluable(source, expr)
        result = prom.query(query)
        checked += 1
        if not result or all(math.isnan(float(r["value"][1])) for r in result):
            empty.append(f"{source}: {query}")
    assert checked >= 30
    assert not empty, "expressions without data:\n" + "\n".join(empty)


def test_histogram_quantile_p99_within_one_bucket(scraped_run: Any) -> None:
    prom, truth, receiver = scraped_run
    spans = [s for s in receiver.spans() if attr(s.attributes, "gen_ai.usage.output_tokens")]
    durations = sorted((s.end_time_unix_nano - s.start_time_unix_nano) / 1e9 for s in spans)
    true_p99 = durations[math.ceil(0.99 * len(durations)) - 1]
    (sample,) = prom.query('histogram_quantile(0.99, sum by (le) '
                           '(gen_ai_server_request_duration_seconds_bucket))')
    estimate = float(sample["value"][1])
    bounds = [0.0, *DEFAULT_LATENCY_BUCKETS]
    index = next(i for i, b in enumerate(bounds) if true_p99 <= b)
    low, high = bounds[max(0, index - 2)], bounds[min(len(bounds) - 1, index + 1)]
    assert low <= estimate <= high, (true_p99, estimate)


def test_exemplars_point_at_real_request_spans(scraped_run: Any) -> None:
    prom, _, receiver = scraped_run
    now = time.time()
    data = prom.api("query_exemplars", query="gen_ai_server_request_duration_seconds_bucket",
                    start=now - 600, end=now)
    trace_ids = {ex["labels"]["trace_id"] for series in data for ex in series["exemplars"]}
    span_ids = {ex["labels"]["span_id"] for series in data for ex in series["exemplars"]}
    requests = [s for s in receiver.spans() if attr(s.attributes, "gen_ai.usage.output_tokens")]
    assert trace_ids and span_ids
    assert span_ids <= {s.span_id.hex() for s in requests}
    assert trace_ids <= {s.trace_id.hex() for s in requests}
