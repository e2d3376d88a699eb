"""LLM.generate / LLM.chat on the real vLLM CPU engine: one child span per request, engine times."""

from __future__ import annotations

from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.trace import StatusCode

from otel_rollout import rollout_step
from otel_rollout.semconv import BATCH_SPAN_NAME
from testkit.engines import long_tail_lengths
from tests.conftest import OTelHarness

pytestmark = pytest.mark.vllm


def _request_spans(otel: OTelHarness) -> list[Any]:
    return [
        s
        for s in otel.finished_spans()
        if s.attributes.get("gen_ai.provider.name") == "vllm" and s.name != BATCH_SPAN_NAME
    ]


def _batch_spans(otel: OTelHarness) -> list[Any]:
    return [s for s in otel.finished_spans() if s.name == BATCH_SPAN_NAME]


def _params(vllm_module: Any, lengths: list[int]) -> list[Any]:
    return [
        vllm_module.SamplingParams(max_tokens=n, ignore_eos=True, temperature=0.7, seed=i)
        for i, n in enumerate(lengths)
    ]


def test_long_tail_batch_one_child_span_per_request(
    otel: OTelHarness, llm: Any, vllm_module: Any
) -> None:
    lengths = long_tail_lengths(24, seed=1)
    prompts = [f"def task_{i}(x):" for i in range(len(lengths))]
    outputs = llm.generate(prompts, _params(vllm_module, lengths), use_tqdm=False)

    assert [len(o.outputs[0].token_ids) for o in outputs] == lengths
    spans = _request_spans(otel)
    (batch,) = _batch_spans(otel)
    assert len(spans) == len(prompts)
    assert batch.attributes["rollout.batch.size"] == len(prompts)
    by_id = {s.attributes["gen_ai.response.id"]: s for s in spans}
    assert set(by_id) == {o.request_id for o in outputs}
    for output in outputs:
        span = by_id[output.request_id]
        assert span.parent.span_id == batch.context.span_id
        assert span.kind == trace.SpanKind.INTERNAL
        assert span.name.startswith("text_completion ")
        assert span.attributes["gen_ai.usage.output_tokens"] == len(output.outputs[0].token_ids)
        assert span.attributes["gen_ai.usage.input_tokens"] == len(output.prompt_token_ids)
        assert span.attributes["gen_ai.request.max_tokens"] == len(output.outputs[0].token_ids)
        assert span.attributes["gen_ai.response.finish_reasons"] == ("length",)
        assert span.attributes["rollout.timing.source"] == "engine_steps"
        # Real per-request times: inside the call, not the call's own start and end.
        assert batch.start_time <= span.start_time < span.end_time <= batch.end_time
        (event,) = [e for e in span.events if e.name == "gen_ai.first_token"]
        assert span.start_time < event.timestamp <= span.end_time
    # The long tail is visible: the 256-token request finishes last.
    slowest = max(spans, key=lambda s: s.end_time - s.start_time)
    assert slowest.attributes["gen_ai.usage.output_tokens"] == max(lengths)

    durations = otel.metric_points("gen_ai.server.request.duration")
    assert sum(p.count for p in durations) == len(prompts)
    tokens = [
        p
        for p in otel.metric_points("gen_ai.client.token.usage")
        if p.attributes["gen_ai.token.type"] == "output"
    ]
    assert sum(p.count for p in tokens) == len(prompts)
    assert sum(p.sum for p in tokens) == sum(lengths)
    for p in durations:
        assert set(p.attributes) <= {
            "gen_ai.provider.name",
            "gen_ai.request.model",
            "gen_ai.operation.name",
            "rollout.finish_reason",
            "error.type",
        }
    span_ids = {(s.context.trace_id, s.context.span_id) for s in spans}
    exemplars = [e for p in durations for e in p.exemplars]
    assert exemplars, "histogram points carry exemplars"
    assert all((e.trace_id, e.span_id) in span_ids for e in exemplars)
    active = otel.metric_points("rollout.requests.active")
    assert sum(p.value for p in active) == 0


def test_engine_stats_mode_matches_engine_timings(
    otel: OTelHarness, llm_stats: Any, vllm_module: Any
) -> None:
    lengths = [8, 16, 64, 128]
    outputs = llm_stats.generate(
        [f"q{i}" for i in range(4)], _params(vllm_module, lengths), use_tqdm=False
    )
    by_id = {s.attributes["gen_ai.response.id"]: s for s in _request_spans(otel)}
    assert len(by_id) == 4
    for output in outputs:
        m = output.metrics
        span = by_id[output.request_id]
        assert span.attributes["rollout.timing.source"] == "engine"
        # Engine-only arithmetic: first-token latency plus the decode time between its stamps.
        engine_duration = m.first_token_latency + (m.last_token_ts - m.first_token_ts)
        assert abs((span.end_time - span.start_time) / 1e9 - engine_duration) < 1e-3
        (event,) = [e for e in span.events if e.name == "gen_ai.first_token"]
        assert abs((event.timestamp - span.start_time) / 1e9 - m.first_token_latency) < 1e-3
        assert span.start_time == int(m.arrival_time * 1e9)
        assert span.attributes["rollout.request.queue_time"] >= 0
    queue = otel.metric_points("rollout.request.queue_time")
    assert sum(p.count for p in queue) == 4


def test_chat_and_nesting_under_caller_and_step(
    otel: OTelHarness, llm: Any, vllm_module: Any
) -> None:
    tracer = trace.get_tracer("test")
    conversations = [[{"role": "user", "content": "hello"}], [{"role": "user", "content": "bye"}]]
    with tracer.start_as_current_span("caller") as caller, rollout_step(7):
        outputs = llm.chat(
            conversations, vllm_module.SamplingParams(max_tokens=5, ignore_eos=True), use_tqdm=False
        )
    assert len(outputs) == 2
    spans = _request_spans(otel)
    assert len(spans) == 2
    (step_span,) = [s for s in otel.finished_spans() if s.name == "rollout.step"]
    (batch,) = _batch_spans(otel)
    assert step_span.parent.span_id == caller.get_span_context().span_id
    assert batch.parent.span_id == step_span.context.span_id
    for span in spans:
        assert span.name.startswith("chat ")
        assert span.attributes["gen_ai.operation.name"] == "chat"
        assert span.attributes["rollout.step"] == 7
        assert span.context.trace_id == caller.get_span_context().trace_id
        assert span.attributes["gen_ai.usage.output_tokens"] == 5
    assert step_span.attributes["rollout.step.requests"] == 2


def test_engine_error_propagates_unmodified(otel: OTelHarness, llm: Any, vllm_module: Any) -> None:
    too_long = "x " * 5000  # longer than max_model_len=2048: vLLM rejects it
    with pytest.raises(Exception) as excinfo:
        llm.generate([too_long], vllm_module.SamplingParams(max_tokens=4), use_tqdm=False)
    # Same exception as the uninstrumented engine raises: type and message from vLLM itself.
    assert "otel_rollout" not in repr(excinfo.value)
    assert excinfo.traceback[-1].path.as_posix().find("otel_rollout") == -1
    (batch,) = _batch_spans(otel)
    assert batch.status.status_code == StatusCode.ERROR
    assert batch.attributes["error.type"] == type(excinfo.value).__qualname__
    (span,) = _request_spans(otel)
    assert span.attributes["error.type"] == type(excinfo.value).__qualname__
    assert span.status.status_code == StatusCode.ERROR
    assert sum(p.value for p in otel.metric_points("rollout.requests.active")) == 0
    # The engine still serves afterwards.
    assert len(llm.generate(["ok"], vllm_module.SamplingParams(max_tokens=2), use_tqdm=False)) == 1


def test_content_not_captured_by_default(otel: OTelHarness, llm: Any, vllm_module: Any) -> None:
    canary = "CANARY-7f3a prompt text"
    llm.generate([canary], vllm_module.SamplingParams(max_tokens=3), use_tqdm=False)
    for span in otel.finished_spans():
        for value in span.attributes.values():
            assert "CANARY" not in str(value)
        for event in span.events:
            assert "CANARY" not in str(event.attributes)
