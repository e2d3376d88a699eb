"""Step-aware sampling end to end (issue #19): a real instrumented vLLM run under
``opentelemetry-instrument`` with the default sampling settings (``OTEL_ROLLOUT_SAMPLE_RATE``
0.02), its spans over real OTLP, its metrics scraped by a real Prometheus (native histograms).

Every request is counted in Prometheus; only a share of the request spans arrives; every exemplar
Prometheus stores names a span that arrived (a click on a bucket never leads nowhere).

The run also opts in to the GenAI conventions' newest names
(``OTEL_SEMCONV_STABILITY_OPT_IN=gen_ai_latest_experimental``): on a real engine under
``opentelemetry-instrument``, its token counters hold every request's exact output tokens and
the old token histogram is gone (tests/pipeline/test_semconv_prometheus.py runs the dashboards'
token queries on both conventions).
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest

from testkit.otlp_receiver import OTLPReceiver, attr
from testkit.prometheus import Prometheus, free_port
from testkit.workload_runner import lingering_workload, workload_env

pytestmark = [pytest.mark.vllm, pytest.mark.prometheus]

STEPS, BATCH = 2, 300
NATIVE = "gen_ai_server_request_duration_seconds"


class Run:
    def __init__(self, prom: Prometheus, truth: list[Any], receiver: OTLPReceiver) -> None:
        self.prom, self.truth, self.receiver = prom, truth, receiver

    def request_spans(self) -> list[Any]:
        return [
            s for s in self.receiver.spans() if attr(s.attributes, "gen_ai.usage.output_tokens")
        ]


@pytest.fixture(scope="module")
def sampled_run(
    tmp_path_factory: pytest.TempPathFactory, tiny_model: str, vllm_module: Any
) -> Iterator[Run]:
    port = free_port()
    prom = Prometheus(tmp_path_factory.mktemp("prom-sampled"), port, native=True)
    receiver = OTLPReceiver().start()
    env = workload_env(
        OTEL_TRACES_EXPORTER="otlp",
        OTEL_METRICS_EXPORTER="rollout_prometheus",
        OTEL_EXPORTER_OTLP_ENDPOINT=receiver.grpc_endpoint,
        OTEL_EXPORTER_PROMETHEUS_HOST="127.0.0.1",
        OTEL_EXPORTER_PROMETHEUS_PORT=str(port),
        OTEL_SEMCONV_STABILITY_OPT_IN="http,gen_ai_latest_experimental",
    )
    assert not any(k.startswith("OTEL_ROLLOUT_SAMPLE") for k in env), "the defaults are tested"
    workload = lingering_workload(
        tiny_model, env, "--steps", str(STEPS), "--batch", str(BATCH), "--natural-stops"
    )
    try:
        with workload as truth:
            prom.wait_for(f"histogram_count(sum({NATIVE})) == {len(truth)}")
            receiver.wait_for(
                lambda r: (
                    sum(1 for s in r.spans() if attr(s.attributes, "rollout.step.requests"))
                    == STEPS
                )
            )
            time.sleep(3)  # the last scrape after the last export
            yield Run(prom, truth, receiver)
    finally:
        receiver.stop()
        prom.stop()


def test_counts_are_complete_spans_are_sampled_and_exemplars_resolve(sampled_run: Run) -> None:
    n = len(sampled_run.truth)
    assert n == STEPS * BATCH
    assert sampled_run.prom.scalar(f"histogram_count(sum({NATIVE}))") == n  # every request
    spans = sampled_run.request_spans()
    share = len(spans) / n
    reasons = [attr(s.attributes, "rollout.sampling.reason") for s in spans]
    print(f"\nkept {len(spans)} of {n} request spans ({share:.1%}): {Counter(reasons)}")
    assert share <= 0.16  # the tail (10 %), every 50th of the rest, the truncations
    assert reasons.count("truncated") == STEPS * BATCH // 100  # every truncation
    assert set(reasons) <= {"truncated", "tail", "rate", "slowest"}
    assert reasons.count("tail") >= STEPS * int(0.09 * BATCH)  # the step's tail
    exemplars = sampled_run.prom.exemplars(NATIVE)
    assert exemplars
    assert {e["labels"]["span_id"] for e in exemplars} <= {s.span_id.hex() for s in spans}


def test_newest_genai_token_metrics_count_every_request(sampled_run: Run) -> None:
    prom, truth = sampled_run.prom, sampled_run.truth
    outputs = sum(t["output_tokens"] for t in truth)
    assert prom.scalar("sum(gen_ai_client_inference_usage_output_tokens_total)") == outputs
    histogram = "gen_ai_client_inference_operation_output_tokens"
    assert prom.scalar(f"histogram_sum(sum({histogram}))") == outputs
    assert prom.scalar(f"histogram_count(sum({histogram}))") == len(truth)
    assert prom.scalar("sum(gen_ai_client_inference_usage_input_tokens_total)") > 0
    assert not prom.query("gen_ai_client_token_usage")  # the default name is not emitted
    spans = sampled_run.request_spans()
    cached = [attr(s.attributes, "gen_ai.usage.cache_read.input_tokens") for s in spans]
    assert all(c is not None for c in cached)  # vLLM reports cached tokens per request
    assert all(attr(s.attributes, "rollout.usage.cached_tokens") is None for s in spans)
