"""Zero-code: ``opentelemetry-instrument`` alone instruments vLLM, exporting over real OTLP."""

from __future__ import annotations

from typing import Any

import pytest

from testkit.otlp_receiver import OTLPReceiver, attr
from testkit.workload_runner import run_workload, workload_env

pytestmark = pytest.mark.vllm


@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
def test_opentelemetry_instrument_exports_request_spans_and_exemplars(
    otlp_receiver: OTLPReceiver, tiny_model: str, vllm_module: Any, protocol: str
) -> None:
    endpoint = otlp_receiver.grpc_endpoint if protocol == "grpc" else otlp_receiver.http_endpoint
    env = workload_env(
        OTEL_TRACES_EXPORTER="otlp",
        OTEL_METRICS_EXPORTER="otlp",
        OTEL_EXPORTER_OTLP_PROTOCOL=protocol,
        OTEL_EXPORTER_OTLP_ENDPOINT=endpoint,
    )
    truth = run_workload(tiny_model, env, "--steps", "2", "--batch", "8")
    assert len(truth) == 16

    spans = otlp_receiver.spans()
    requests = [s for s in spans if attr(s.attributes, "gen_ai.usage.output_tokens") is not None]
    steps = {s.span_id: s for s in spans if s.name == "rollout.step"}
    batches = {s.span_id: s for s in spans if s.name == "rollout.batch"}
    assert len(requests) == 16 and len(steps) == 2 and len(batches) == 2
    tokens = {(t["step"], t["request_id"]): t["output_tokens"] for t in truth}
    for span in requests:
        step = attr(span.attributes, "rollout.step")
        rid = attr(span.attributes, "gen_ai.response.id")
        assert attr(span.attributes, "gen_ai.usage.output_tokens") == tokens[(step, rid)]
        batch = batches[span.parent_span_id]
        assert steps[batch.parent_span_id].trace_id == span.trace_id

    request_ids = {(s.trace_id, s.span_id) for s in requests}
    durations = [m for m in otlp_receiver.metrics() if m.name == "gen_ai.server.request.duration"]
    assert durations
    last = durations[-1]  # cumulative: the final export holds every request
    assert sum(p.count for p in last.histogram.data_points) == 16
    # Reservoirs reset at each collection: the exemplars are spread over the exports.
    exemplars = [e for m in durations for p in m.histogram.data_points for e in p.exemplars]
    assert exemplars and all((e.trace_id, e.span_id) in request_ids for e in exemplars)


def test_disabled_instrumentations_leaves_vllm_alone(
    otlp_receiver: OTLPReceiver, tiny_model: str, vllm_module: Any
) -> None:
    env = workload_env(
        OTEL_TRACES_EXPORTER="otlp",
        OTEL_METRICS_EXPORTER="none",
        OTEL_EXPORTER_OTLP_ENDPOINT=otlp_receiver.grpc_endpoint,
        OTEL_PYTHON_DISABLED_INSTRUMENTATIONS="vllm",
    )
    truth = run_workload(tiny_model, env, "--steps", "1", "--batch", "4")
    assert len(truth) == 4
    # vLLM's own start-up spans ("Worker init", ...) may arrive too; none of ours but the step.
    spans = [
        s
        for s in otlp_receiver.spans()
        if s.name.startswith("rollout.") or attr(s.attributes, "gen_ai.provider.name") is not None
    ]
    assert [s.name for s in spans] == [
        "rollout.step"
    ]  # the step API still works; vLLM is untouched
    assert attr(spans[0].attributes, "rollout.step.requests") == 0
