"""Span and metric lookups shared by the SGLang engine tests."""

from __future__ import annotations

from typing import Any

from opentelemetry.trace import StatusCode

from otel_rollout.semconv import BATCH_SPAN_NAME
from tests.conftest import OTelHarness

TOLERANCE_NS = 1_000_000  # SGLang's wall conversion vs ours: both from the same clocks, µs apart


def request_spans(otel: OTelHarness) -> list[Any]:
    return [
        s
        for s in otel.finished_spans()
        if s.attributes.get("gen_ai.provider.name") == "sglang" and s.name != BATCH_SPAN_NAME
    ]


def batch_spans(otel: OTelHarness) -> list[Any]:
    return [s for s in otel.finished_spans() if s.name == BATCH_SPAN_NAME]


def spans_by_id(otel: OTelHarness) -> dict[str, Any]:
    return {s.attributes["gen_ai.response.id"]: s for s in request_spans(otel)}


def in_flight(otel: OTelHarness) -> float:
    return sum(p.value for p in otel.metric_points("rollout.requests.active"))


def params(max_new_tokens: int, **extra: Any) -> dict[str, Any]:
    return {"max_new_tokens": max_new_tokens, "ignore_eos": True, **extra}


def assert_matches(span: Any, out: dict[str, Any], output_tokens: int) -> None:
    meta = out["meta_info"]
    assert (
        span.attributes["gen_ai.usage.output_tokens"] == output_tokens == meta["completion_tokens"]
    )
    assert span.attributes["gen_ai.usage.input_tokens"] == meta["prompt_tokens"]
    assert span.attributes["rollout.usage.cached_tokens"] == meta["cached_tokens"]
    assert span.attributes["gen_ai.response.finish_reasons"] == ("length",)
    assert span.attributes["gen_ai.request.model"] == "tiny-llama-v1"
    assert span.name == "text_completion tiny-llama-v1"
    assert span.status.status_code is not StatusCode.ERROR
