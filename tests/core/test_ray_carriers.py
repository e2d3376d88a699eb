"""The Ray step channel's per-call costs, without Ray: a carrier made and continued once per context,
and a report that flushes spans only when it has some (issue #40 item 7, figure 11)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from opentelemetry import baggage, trace
from opentelemetry import context as otel_context
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags

from otel_rollout.context import current_step, step_number, step_view
from otel_rollout.propagation import extract_context
from otel_rollout.ray import instrumentor
from otel_rollout.ray import steps as ray_steps
from otel_rollout.ray.steps import CALL_ID, RemoteStep, _continued, _has_span, remote_call
from otel_rollout.record import RequestRecord, TrajectoryRecord
from otel_rollout.semconv import BAGGAGE_STEP_KEY


@pytest.fixture(autouse=True)
def _fresh() -> Iterator[None]:
    ray_steps._ENTERED.clear()
    instrumentor._last_carrier = None
    yield
    ray_steps._ENTERED.clear()
    instrumentor._last_carrier = None


def _caller_context(trace_id: int, key: str, number: int) -> otel_context.Context:
    span = NonRecordingSpan(SpanContext(trace_id, 0x1234, True, TraceFlags(1)))
    ctx = trace.set_span_in_context(span)
    ctx = baggage.set_baggage(BAGGAGE_STEP_KEY, key, ctx)
    return baggage.set_baggage("rollout.step", str(number), ctx)


def test_a_callers_carrier_is_made_once_per_context_and_copied_for_each_call() -> None:
    token = otel_context.attach(_caller_context(0xABC, "step-key-1", 3))
    try:
        first = instrumentor._carrier()
        first[CALL_ID] = "call-1"  # what a call adds must not reach the next call
        second = instrumentor._carrier()
    finally:
        otel_context.detach(token)
    assert CALL_ID not in second and second["traceparent"] == first["traceparent"]
    assert "step-key-1" in second["baggage"] and "rollout.step=3" in second["baggage"]
    token = otel_context.attach(_caller_context(0xDEF, "step-key-2", 4))
    try:
        other = instrumentor._carrier()  # another context: its own carrier
    finally:
        otel_context.detach(token)
    assert other["traceparent"] != second["traceparent"] and "step-key-2" in other["baggage"]


def test_calls_of_one_caller_continue_one_context_that_names_the_step() -> None:
    token = otel_context.attach(_caller_context(0xABC, "step-key-1", 3))
    try:
        carrier = instrumentor._carrier()
    finally:
        otel_context.detach(token)
    calls = [{**carrier, CALL_ID: f"call-{i}"} for i in range(3)]
    contexts = [_continued(c)[0] for c in calls]
    assert contexts[0] is contexts[1] is contexts[2]  # one object: step_view's cache finds it
    ctx, key = _continued(calls[0])
    assert key == "step-key-1" and step_number(ctx) == 3
    step = current_step(ctx)
    assert isinstance(step, RemoteStep) and step.key == "step-key-1"
    assert trace.get_current_span(ctx).get_span_context().trace_id == 0xABC
    # what it continues is what extracting this carrier alone gives
    alone = extract_context(calls[2])
    assert (
        trace.get_current_span(alone).get_span_context()
        == trace.get_current_span(ctx).get_span_context()
    )
    other = {**calls[0], "traceparent": calls[0]["traceparent"].replace("abc", "abd")}
    assert _continued(other)[0] is not ctx


def test_remote_call_attaches_the_continued_step_and_detaches_it() -> None:
    token = otel_context.attach(_caller_context(0xABC, "step-key-1", 7))
    try:
        carrier = {**instrumentor._carrier(), CALL_ID: "call-1"}
    finally:
        otel_context.detach(token)
    before = otel_context.get_current()
    with remote_call(carrier):
        view = step_view()
        assert view.number == 7 and isinstance(view.step, RemoteStep)
    assert otel_context.get_current() is before
    ray_steps.LOCAL.take("step-key-1")  # the finished call's report, not sent without Ray


def test_carriers_the_cache_cannot_hold_are_continued_all_the_same() -> None:
    token = otel_context.attach(_caller_context(0xABC, "step-key-1", 3))
    try:
        carrier: dict[str, object] = {**instrumentor._carrier(), "extra": ["a list"]}
    finally:
        otel_context.detach(token)
    ctx, key = _continued(carrier)  # type: ignore[arg-type]
    assert key == "step-key-1" and step_number(ctx) == 3 and not ray_steps._ENTERED


def test_the_cache_stays_bounded() -> None:
    for i in range(ray_steps.ENTERED_MAX * 3):
        _continued({"traceparent": f"00-{i + 1:032x}-{1:016x}-01", CALL_ID: "x"})
    assert 0 < len(ray_steps._ENTERED) <= ray_steps.ENTERED_MAX


def test_a_report_flushes_spans_only_when_it_has_some() -> None:
    kept = RequestRecord("vllm", "m", "text_completion", 1, 2)
    dropped = RequestRecord("vllm", "m", "text_completion", 1, 2)
    dropped.kept = None
    assert not _has_span([dropped, dropped]) and not _has_span([])
    assert _has_span([dropped, kept])
    trajectory = TrajectoryRecord("agent", 1, 2, "ok", (), 1, (), (), 0.0, 0.0, 0.0, 0.0)
    assert _has_span([dropped, trajectory])
