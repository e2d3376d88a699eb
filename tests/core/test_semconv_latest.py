"""OTEL_SEMCONV_STABILITY_OPT_IN=gen_ai_latest_experimental: the GenAI conventions' newest token
metrics in place of ``gen_ai.client.token.usage``, read as OpenTelemetry contrib reads it.

The default names are tested everywhere else (test_telemetry); here: the opt-in's parsing agrees
with contrib's own, its instruments carry exact counts with the labels the conventions require,
the counters add up to the histograms, and the cached-token span attribute takes its GenAI name.
"""

from __future__ import annotations

from typing import Any

import pytest
from opentelemetry.instrumentation import _semconv as contrib

from otel_rollout.config import GEN_AI_LATEST, SEMCONV_OPT_IN_ENV, RolloutConfig, load_config
from otel_rollout.semconv import (
    GEN_AI_OPERATION_INPUT_TOKENS,
    GEN_AI_OPERATION_OUTPUT_TOKENS,
    GEN_AI_USAGE_CACHE_READ_COUNTER,
    GEN_AI_USAGE_INPUT_TOKENS_COUNTER,
    GEN_AI_USAGE_OUTPUT_TOKENS_COUNTER,
)
from testkit.records import make_record
from tests.conftest import OTelHarness

LATEST = RolloutConfig(gen_ai_latest=True)
SCOPE = "tests.core.gen_ai_latest"  # its own meter: the token instruments differ by mode


@pytest.mark.parametrize(
    "value, latest",
    [
        (None, False),
        ("", False),
        (GEN_AI_LATEST, True),
        (f"http, {GEN_AI_LATEST}", True),
        (f"database/dup,{GEN_AI_LATEST} ,http", True),
        ("http", False),
        ("gen_ai_latest", False),
        (f"{GEN_AI_LATEST}x", False),
    ],
)
def test_opt_in_is_read_as_contrib_reads_it(
    value: str | None, latest: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    environ = {} if value is None else {SEMCONV_OPT_IN_ENV: value}
    assert load_config(environ).gen_ai_latest is latest
    # contrib's own reader, on the same environment, decides the same
    stability = contrib._OpenTelemetrySemanticConventionStability
    if value is None:
        monkeypatch.delenv(SEMCONV_OPT_IN_ENV, raising=False)
    else:
        monkeypatch.setenv(SEMCONV_OPT_IN_ENV, value)
    monkeypatch.setattr(stability, "_initialized", False)
    monkeypatch.setattr(stability, "_OTEL_SEMCONV_STABILITY_SIGNAL_MAPPING", {})
    stability._initialize()
    mode = stability._get_opentelemetry_stability_opt_in_mode(
        contrib._OpenTelemetryStabilitySignalType.GEN_AI
    )
    assert (mode == contrib._StabilityMode.GEN_AI_LATEST_EXPERIMENTAL) is latest


def test_opt_in_is_never_a_problem() -> None:
    """The variable lists values for every signal's instrumentations: none is ours to refuse."""
    config = load_config({SEMCONV_OPT_IN_ENV: "http,something_else"})
    assert config.problems == () and config.gen_ai_latest is False


def _points(otel: OTelHarness, name: str, model: str) -> list[Any]:
    return [p for p in otel.metric_points(name) if p.attributes["gen_ai.request.model"] == model]


def test_latest_token_metrics_values_and_labels(otel, make_telemetry, model) -> None:
    make_telemetry(LATEST, scope=SCOPE).emit(make_record(model))  # 17 in (3 cached), 9 out
    base = {
        "gen_ai.provider.name": "vllm",
        "gen_ai.request.model": model,
        "gen_ai.operation.name": "text_completion",
        "rollout.finish_reason": "length",
    }
    for name, value in ((GEN_AI_OPERATION_INPUT_TOKENS, 17), (GEN_AI_OPERATION_OUTPUT_TOKENS, 9)):
        (point,) = _points(otel, name, model)
        assert point.attributes == base, name  # no modality on the histograms
        assert (point.count, point.sum) == (1, value), name
    for name, value, modality in (
        (GEN_AI_USAGE_INPUT_TOKENS_COUNTER, 17, "unknown"),
        (GEN_AI_USAGE_OUTPUT_TOKENS_COUNTER, 9, "text"),
        (GEN_AI_USAGE_CACHE_READ_COUNTER, 3, "unknown"),
    ):
        (point,) = _points(otel, name, model)
        assert point.attributes == {**base, "gen_ai.token.modality": modality}, name
        assert point.value == value, name
    assert _points(otel, "gen_ai.client.token.usage", model) == []
    # the other request figures keep their names
    assert _points(otel, "gen_ai.server.request.duration", model)[0].count == 1


def test_counters_add_up_to_the_histograms(otel, make_telemetry, model) -> None:
    telemetry = make_telemetry(LATEST, scope=SCOPE)
    records = [
        make_record(model, prompt_tokens=10 + i, output_tokens=3 * i + 1, cached_tokens=i or None)
        for i in range(7)
    ]
    for record in records:
        telemetry.emit(record)
    totals = {
        name: sum(p.value for p in _points(otel, name, model))
        for name in (
            GEN_AI_USAGE_INPUT_TOKENS_COUNTER,
            GEN_AI_USAGE_OUTPUT_TOKENS_COUNTER,
            GEN_AI_USAGE_CACHE_READ_COUNTER,
        )
    }
    assert totals[GEN_AI_USAGE_INPUT_TOKENS_COUNTER] == sum(r.prompt_tokens for r in records)
    assert totals[GEN_AI_USAGE_OUTPUT_TOKENS_COUNTER] == sum(r.output_tokens for r in records)
    assert totals[GEN_AI_USAGE_CACHE_READ_COUNTER] == sum(r.cached_tokens or 0 for r in records)
    (inputs,) = _points(otel, GEN_AI_OPERATION_INPUT_TOKENS, model)
    (outputs,) = _points(otel, GEN_AI_OPERATION_OUTPUT_TOKENS, model)
    assert (inputs.count, inputs.sum) == (7, totals[GEN_AI_USAGE_INPUT_TOKENS_COUNTER])
    assert (outputs.count, outputs.sum) == (7, totals[GEN_AI_USAGE_OUTPUT_TOKENS_COUNTER])


def test_no_cache_read_point_where_the_engine_reports_none(otel, make_telemetry, model) -> None:
    make_telemetry(LATEST, scope=SCOPE).emit(make_record(model, cached_tokens=None))
    assert _points(otel, GEN_AI_USAGE_CACHE_READ_COUNTER, model) == []
    assert _points(otel, GEN_AI_USAGE_INPUT_TOKENS_COUNTER, model)[0].value == 17


def test_latest_span_names_cached_tokens_the_genai_way(otel, make_telemetry, model) -> None:
    make_telemetry(LATEST, scope=SCOPE).emit(make_record(model))
    (span,) = [
        s for s in otel.finished_spans() if s.attributes.get("gen_ai.request.model") == model
    ]
    assert span.attributes["gen_ai.usage.cache_read.input_tokens"] == 3
    assert "rollout.usage.cached_tokens" not in span.attributes
    assert span.attributes["gen_ai.usage.input_tokens"] == 17


def test_latest_histograms_carry_exemplars_of_their_span(otel, make_telemetry, model) -> None:
    telemetry = make_telemetry(LATEST, scope=SCOPE)
    for i in range(3):
        telemetry.emit(make_record(model, request_id=f"r{i}", output_tokens=5 + i))
    spans = {
        s.context.span_id: s
        for s in otel.finished_spans()
        if s.attributes.get("gen_ai.request.model") == model
    }
    (outputs,) = [
        p
        for (name, _), p in otel._points().items()
        if name == GEN_AI_OPERATION_OUTPUT_TOKENS and p.attributes["gen_ai.request.model"] == model
    ]
    assert outputs.exemplars
    for e in outputs.exemplars:
        assert e.value == spans[e.span_id].attributes["gen_ai.usage.output_tokens"]
