"""Telemetry.emit on hand-built records: span timeline, attributes, errors, metrics, exemplars."""

from __future__ import annotations

import asyncio
import json
import os
import socket
from typing import Any

import pytest
from opentelemetry.trace import SpanKind, StatusCode

from otel_rollout.config import RolloutConfig, load_config
from otel_rollout.record import StreamClosedEarly
from otel_rollout.steps import StepScope
from testkit.records import make_record
from tests.conftest import OTelHarness, flush_emitters

GENAI = "gen_ai.server.request.duration"


def _request_spans(otel: OTelHarness, model: str) -> list[Any]:
    return [s for s in otel.finished_spans() if s.attributes.get("gen_ai.request.model") == model]


def _points(otel: OTelHarness, name: str, model: str) -> list[Any]:
    return [p for p in otel.metric_points(name) if p.attributes["gen_ai.request.model"] == model]


def test_span_timestamps_are_the_records_timeline(otel, make_telemetry, model) -> None:
    record = make_record(model)
    arrival, first, finish = record.arrival_ns, record.first_token_ns, record.finish_ns
    make_telemetry().emit(record)

    (span,) = _request_spans(otel, model)
    assert span.name == f"text_completion {model}"
    assert span.kind == SpanKind.INTERNAL
    assert span.start_time == arrival
    assert span.end_time == finish
    scheduled, first_token = span.events
    assert (scheduled.name, scheduled.timestamp) == ("rollout.scheduled", record.scheduled_ns)
    assert first_token.name == "gen_ai.first_token"
    assert first_token.timestamp == first
    assert span.status.status_code == StatusCode.UNSET


def test_no_first_token_event_without_first_token(otel, make_telemetry, model) -> None:
    make_telemetry().emit(make_record(model, first_token_ns=None, scheduled_ns=None))
    (span,) = _request_spans(otel, model)
    assert list(span.events) == []
    assert "rollout.request.time_to_first_token" not in span.attributes
    assert "rollout.request.queue_time" not in span.attributes
    assert _points(otel, "gen_ai.server.time_to_first_token", model) == []
    assert _points(otel, "gen_ai.server.time_per_output_token", model) == []
    assert _points(otel, "rollout.request.queue_time", model) == []


def test_attributes_names_and_types(otel, make_telemetry, model) -> None:
    make_telemetry().emit(make_record(model))
    (span,) = _request_spans(otel, model)
    attrs = dict(span.attributes)
    expected = {
        "gen_ai.operation.name": "text_completion",
        "gen_ai.provider.name": "vllm",
        "gen_ai.request.model": model,
        "gen_ai.response.id": "req-42",
        "gen_ai.request.max_tokens": 9,
        "gen_ai.request.temperature": 0.7,
        "gen_ai.request.top_p": 0.95,
        "gen_ai.request.choice.count": 1,
        "gen_ai.usage.input_tokens": 17,
        "gen_ai.usage.output_tokens": 9,
        "gen_ai.response.finish_reasons": ("length",),
        "rollout.usage.cached_tokens": 3,
        "rollout.timing.source": "engine",
        "rollout.request.queue_time": 0.25,
        "rollout.request.time_to_first_token": 0.75,
        "rollout.request.prefill_time": 0.5,
        "rollout.request.decode_time": 2.0,
        # made without a replica: the hand-over names it after this process
        "rollout.replica": f"{socket.gethostname()}:{os.getpid()}",
    }
    assert attrs == expected
    # The SDK stores sequences as tuples; the semconv type is string[] (a list, not one string).
    assert isinstance(attrs["gen_ai.response.finish_reasons"], tuple)
    for key in (
        "gen_ai.request.max_tokens",
        "gen_ai.request.choice.count",
        "gen_ai.usage.input_tokens",
        "gen_ai.usage.output_tokens",
        "rollout.usage.cached_tokens",
    ):
        assert type(attrs[key]) is int, key
    for key in (
        "gen_ai.request.temperature",
        "gen_ai.request.top_p",
        "rollout.request.queue_time",
        "rollout.request.time_to_first_token",
    ):
        assert type(attrs[key]) is float, key
    assert "error.type" not in attrs
    assert "gen_ai.input.messages" not in attrs and "gen_ai.output.messages" not in attrs


def test_multiple_choices_keep_every_finish_reason(otel, make_telemetry, model) -> None:
    make_telemetry().emit(make_record(model, finish_reasons=("stop", "length"), n=2))
    (span,) = _request_spans(otel, model)
    assert span.attributes["gen_ai.response.finish_reasons"] == ("stop", "length")
    (point,) = _points(otel, GENAI, model)
    assert point.attributes["rollout.finish_reason"] == "stop"  # the first choice's, one label


def test_metrics_values_and_bounded_labels(otel, make_telemetry, model) -> None:
    make_telemetry().emit(make_record(model))
    base = {
        "gen_ai.provider.name": "vllm",
        "gen_ai.request.model": model,
        "gen_ai.operation.name": "text_completion",
        "rollout.finish_reason": "length",
    }

    expected = {
        GENAI: 2.75,
        "gen_ai.server.time_to_first_token": 0.75,
        "gen_ai.server.time_per_output_token": 0.25,
        "rollout.request.queue_time": 0.25,
    }
    for name, value in expected.items():
        (point,) = _points(otel, name, model)
        assert point.attributes == base, name
        assert point.count == 1, name
        assert point.sum == pytest.approx(value, abs=1e-9), name
    tokens = {
        p.attributes["gen_ai.token.type"]: p
        for p in _points(otel, "gen_ai.client.token.usage", model)
    }
    assert set(tokens) == {"input", "output"}
    assert (tokens["input"].count, tokens["input"].sum) == (1, 17)
    assert (tokens["output"].count, tokens["output"].sum) == (1, 9)
    assert tokens["output"].attributes == {**base, "gen_ai.token.type": "output"}


def test_single_token_has_no_time_per_output_token(otel, make_telemetry, model) -> None:
    make_telemetry().emit(make_record(model, output_tokens=1))
    assert _points(otel, "gen_ai.server.time_per_output_token", model) == []
    assert len(_points(otel, GENAI, model)) == 1


@pytest.mark.parametrize(
    "error, finish, type_name",
    [
        (ValueError("engine said no"), "error", "ValueError"),
        (StreamClosedEarly("closed"), "abort", "StreamClosedEarly"),
        (asyncio.CancelledError(), "abort", "CancelledError"),
        (GeneratorExit(), "abort", "GeneratorExit"),
    ],
)
def test_error_path(otel, make_telemetry, model, error, finish, type_name) -> None:
    make_telemetry().emit(make_record(model, error=error, finish_reasons=()))
    (span,) = _request_spans(otel, model)
    assert span.status.status_code == StatusCode.ERROR
    assert span.status.description.startswith(type_name)
    assert span.attributes["error.type"] == type_name
    assert "gen_ai.response.finish_reasons" not in span.attributes
    (point,) = _points(otel, GENAI, model)
    assert point.attributes["rollout.finish_reason"] == finish
    assert point.attributes["error.type"] == type_name


def test_error_wins_over_engine_finish_reason(otel, make_telemetry, model) -> None:
    make_telemetry().emit(
        make_record(model, error=RuntimeError("x" * 1000), finish_reasons=("length",))
    )
    (span,) = _request_spans(otel, model)
    assert span.status.description == "RuntimeError: " + "x" * 256  # message kept short
    (point,) = _points(otel, GENAI, model)
    assert point.attributes["rollout.finish_reason"] == "error"


def test_exemplars_carry_the_request_spans_ids(otel, make_telemetry, model) -> None:
    telemetry = make_telemetry()
    records = [make_record(model, request_id=f"r{i}", output_tokens=5 + i) for i in range(3)]
    for record in records:
        telemetry.emit(record)
    spans = _request_spans(otel, model)
    assert len(spans) == 3
    ids = {(s.context.trace_id, s.context.span_id) for s in spans}
    # One collection for all instruments: the SDK hands out a reservoir's exemplars once per
    # collection, so a second metric_points() call would see none.
    points = [
        (name, p)
        for (name, _), p in otel._points().items()
        if p.attributes.get("gen_ai.request.model") == model
    ]
    exemplars: dict[str, list[Any]] = {}
    for name, p in points:
        exemplars.setdefault(name, []).extend(p.exemplars)
    for name in (
        GENAI,
        "gen_ai.server.time_to_first_token",
        "gen_ai.server.time_per_output_token",
        "rollout.request.queue_time",
        "gen_ai.client.token.usage",
    ):
        assert exemplars.get(name), name
        assert {(e.trace_id, e.span_id) for e in exemplars[name]} <= ids, name
    # Each exemplar's value belongs to the span it points at.
    by_span = {s.context.span_id: s for s in spans}
    (output,) = [
        p
        for name, p in points
        if name == "gen_ai.client.token.usage" and p.attributes["gen_ai.token.type"] == "output"
    ]
    assert output.exemplars
    for e in output.exemplars:
        assert e.value == by_span[e.span_id].attributes["gen_ai.usage.output_tokens"]
    for e in exemplars[GENAI]:
        span = by_span[e.span_id]
        assert e.value == pytest.approx((span.end_time - span.start_time) / 1e9)


def test_parent_context_is_used(otel, make_telemetry, model) -> None:
    from opentelemetry import trace

    tracer = otel.tracer_provider.get_tracer("tests.core.parent")
    with tracer.start_as_current_span("trainer") as parent:
        ctx = trace.set_span_in_context(parent)
    make_telemetry().emit(make_record(model), ctx)
    (span,) = _request_spans(otel, model)
    assert span.parent.span_id == parent.get_span_context().span_id
    assert span.context.trace_id == parent.get_span_context().trace_id


def test_in_flight_accounting(otel, make_telemetry, model) -> None:
    telemetry = make_telemetry()
    telemetry.requests_started(model, "text_completion", 5)
    (point,) = [
        p
        for p in otel.metric_points("rollout.requests.active")
        if p.attributes["gen_ai.request.model"] == model
    ]
    assert point.value == 5
    assert telemetry._engines[model].active == 5
    telemetry.requests_ended(model, "text_completion", 5)
    assert [
        p
        for p in otel.metric_points("rollout.requests.active")
        if p.attributes["gen_ai.request.model"] == model
    ] == []
    assert telemetry._engines[model].active == 0


# --- content capture -----------------------------------------------------------------------

PROMPT = "CANARY-PROMPT secret prompt text"
ANSWER = "CANARY-ANSWER secret answer text"


def _content(otel: OTelHarness, model: str) -> dict[str, Any]:
    (span,) = _request_spans(otel, model)
    return dict(span.attributes)


def test_content_capture_is_off_by_default(otel, make_telemetry, model) -> None:
    config = load_config({})
    assert config.capture_content is False
    make_telemetry(config).emit(make_record(model, prompt_text=PROMPT, completion_texts=(ANSWER,)))
    attrs = _content(otel, model)
    assert "gen_ai.input.messages" not in attrs and "gen_ai.output.messages" not in attrs
    assert not any("CANARY" in str(v) for v in attrs.values())
    for name in (GENAI, "gen_ai.client.token.usage"):
        for p in _points(otel, name, model):
            assert not any("CANARY" in str(v) for v in p.attributes.values())


@pytest.mark.parametrize("value", ["true", "True", "1", "SPAN_ONLY"])
def test_content_capture_on_and_truncated(otel, make_telemetry, model, value) -> None:
    config = load_config(
        {
            "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT": value,
            "OTEL_ROLLOUT_CONTENT_MAX_LENGTH": "13",
        }
    )
    assert config.capture_content is True and config.content_max_length == 13
    make_telemetry(config).emit(
        make_record(
            model,
            prompt_text=PROMPT,
            completion_texts=(ANSWER, "short"),
            finish_reasons=("length", "stop"),
            n=2,
        )
    )
    attrs = _content(otel, model)
    inputs = json.loads(attrs["gen_ai.input.messages"])
    outputs = json.loads(attrs["gen_ai.output.messages"])
    assert inputs == [{"role": "user", "parts": [{"type": "text", "content": PROMPT[:13]}]}]
    assert [o["parts"][0]["content"] for o in outputs] == [ANSWER[:13], "short"]
    assert all(o["role"] == "assistant" for o in outputs)
    assert [o["finish_reason"] for o in outputs] == ["length", "stop"]
    assert "secret" not in attrs["gen_ai.input.messages"]


def test_content_capture_keeps_every_completion(otel, make_telemetry, model) -> None:
    """n=2 where one choice never finished (stream closed early): the vLLM adapter drops None
    finish reasons, so finish_reasons is shorter than completion_texts."""
    config = load_config({"OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT": "true"})
    make_telemetry(config).emit(
        make_record(
            model,
            prompt_text=PROMPT,
            n=2,
            completion_texts=(ANSWER, "second"),
            finish_reasons=("length",),
        )
    )
    outputs = json.loads(_content(otel, model)["gen_ai.output.messages"])
    assert [o["parts"][0]["content"] for o in outputs] == [ANSWER, "second"]


def test_content_capture_default_limit(otel, make_telemetry, model) -> None:
    config = load_config({"OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT": "true"})
    make_telemetry(config).emit(make_record(model, prompt_text="p" * 5000, completion_texts=()))
    attrs = _content(otel, model)
    (message,) = json.loads(attrs["gen_ai.input.messages"])
    assert message["parts"][0]["content"] == "p" * 1024
    assert "gen_ai.output.messages" not in attrs


def test_content_capture_explicit_off(otel, make_telemetry, model) -> None:
    config = load_config({"OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT": "false"})
    make_telemetry(config).emit(make_record(model, prompt_text=PROMPT, completion_texts=(ANSWER,)))
    assert not any("CANARY" in str(v) for v in _content(otel, model).values())


# --- our own failures stay ours --------------------------------------------------------------


class _BrokenHistogram:
    """FAULT INJECTION: an instrument whose record() always raises."""

    def record(self, *args: Any, **kwargs: Any) -> None:
        raise RuntimeError("injected histogram failure")


def test_broken_instrument_is_logged_once_and_not_raised(
    otel, make_telemetry, model, caplog
) -> None:
    telemetry = make_telemetry()
    telemetry.duration = _BrokenHistogram()  # FAULT INJECTION
    with caplog.at_level("WARNING", logger="otel_rollout"):
        for i in range(5):
            telemetry.emit(make_record(model, request_id=f"r{i}"))
        telemetry.flush()  # the failure happens on the emitter's thread
    failures = [r for r in caplog.records if "telemetry failed" in r.getMessage()]
    assert len(failures) == 1
    assert "injected histogram failure" in caplog.text
    assert len(_request_spans(otel, model)) == 5  # spans still end; only the metric failed


def test_config_types() -> None:
    config = RolloutConfig()
    assert config.capture_content is False
    assert config.content_max_length == 1024


def test_engines_and_reinstrumenting_keep_their_observable_counters(otel) -> None:
    """One scope per engine, instruments reused on re-instrument: no callback is left orphaned."""
    from otel_rollout.instrumentation import build_telemetry

    vllm = build_telemetry("vllm", {})
    sglang = build_telemetry("sglang", {})
    again = build_telemetry("vllm", {}, reuse=vllm)
    assert again is vllm
    vllm.requests_started("m-busy", "text_completion")
    sglang.requests_started("m-busy", "text_completion")
    providers = {
        p.attributes["gen_ai.provider.name"]
        for p in otel.metric_points("rollout.engine.busy_time")
        if p.attributes["gen_ai.request.model"] == "m-busy"
    }
    assert providers == {"vllm", "sglang"}
    vllm.requests_ended("m-busy", "text_completion")
    sglang.requests_ended("m-busy", "text_completion")


def test_request_batch_and_step_spans_describe_an_error_alike(otel, make_telemetry, model) -> None:
    telemetry = make_telemetry()
    error = RuntimeError("engine fell over")
    with pytest.raises(RuntimeError), StepScope(7, telemetry=telemetry):
        with telemetry.batch(model, "text_completion", 1):
            telemetry.emit(make_record(model, error=error, finish_reasons=()))
            raise error
    flush_emitters()
    by_name = {}
    for span in otel.finished_spans():
        if span.name in ("rollout.step", "rollout.batch") or span.name.endswith(model):
            by_name[span.name.split(" ")[0]] = span
    assert set(by_name) == {"rollout.step", "rollout.batch", "text_completion"}
    for span in by_name.values():
        assert span.status.status_code == StatusCode.ERROR
        assert span.status.description == "RuntimeError: engine fell over", span.name
        assert span.attributes["error.type"] == "RuntimeError", span.name
