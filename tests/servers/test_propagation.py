"""``server_context``: what a server attaches for a request's headers (no engine needed)."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry import baggage, propagate, trace
from opentelemetry import context as otel_context
from opentelemetry.metrics import NoOpMeterProvider
from opentelemetry.propagators.composite import CompositePropagator

from otel_rollout.config import RolloutConfig
from otel_rollout.context import step_number
from otel_rollout.propagation import extract_context, server_context
from otel_rollout.telemetry import Telemetry
from otel_rollout.vllm import adapter as vllm_adapter
from tests.conftest import OTelHarness

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
SPAN = "00f067aa0ba902b7"
HEADERS = {
    "traceparent": f"00-{TRACE}-{SPAN}-01",
    "baggage": "rollout.step=7,team=rl",
    "content-type": "application/json",
}


def _ids(ctx: Any) -> tuple[str, str]:
    sc = trace.get_current_span(ctx).get_span_context()
    return trace.format_trace_id(sc.trace_id), trace.format_span_id(sc.span_id)


def test_caller_span_and_step_when_nothing_is_attached() -> None:
    ctx = server_context(HEADERS, otel_context.Context())
    assert ctx is not None
    assert _ids(ctx) == (TRACE, SPAN)
    assert step_number(ctx) == 7 and baggage.get_baggage("team", ctx) == "rl"


def test_a_server_span_already_attached_is_kept(otel: OTelHarness) -> None:
    """As ASGI/FastAPI instrumentation leaves it: its span stays the parent; baggage is added."""
    tracer = otel.tracer_provider.get_tracer("tests.servers")
    with tracer.start_as_current_span("POST /v1/completions") as server:
        ctx = server_context(HEADERS)
        assert ctx is not None
        assert trace.get_current_span(ctx) is server
        assert step_number(ctx) == 7
        # With the baggage there too, nothing is left to add: keep the current context.
        token = otel_context.attach(
            baggage.set_baggage("team", "rl", baggage.set_baggage("rollout.step", "3"))
        )
        try:
            assert server_context(HEADERS) is None
        finally:
            otel_context.detach(token)


def test_other_baggage_in_the_context_does_not_hide_the_step() -> None:
    """A context that already holds baggage of another origin (a proxy's, a middleware's) still
    gets the caller's ``rollout.step``; its own entries are kept, never overridden."""
    base = baggage.set_baggage("tenant", "a", otel_context.Context())
    base = baggage.set_baggage("team", "platform", base)
    ctx = server_context(HEADERS, base)
    assert ctx is not None and step_number(ctx) == 7
    assert baggage.get_baggage("tenant", ctx) == "a"
    assert baggage.get_baggage("team", ctx) == "platform"  # the context's own wins


@pytest.mark.parametrize(
    "headers", [None, {}, {"content-type": "application/json"}, {"traceparent": "00-garbage-01"}]
)
def test_nothing_to_attach(headers: Any) -> None:
    assert server_context(headers, otel_context.Context()) is None


def test_baggage_alone_gives_the_step_to_a_root() -> None:
    ctx = server_context({"baggage": "rollout.step=12"}, otel_context.Context())
    assert ctx is not None and step_number(ctx) == 12
    assert not trace.get_current_span(ctx).get_span_context().is_valid


@pytest.fixture
def no_global_propagators() -> Iterator[None]:
    """``OTEL_PROPAGATORS=none`` (or a vendor-only list): the W3C fallback still reads the headers."""
    before = propagate.get_global_textmap()
    propagate.set_global_textmap(CompositePropagator([]))
    try:
        yield
    finally:
        propagate.set_global_textmap(before)


def test_w3c_fallback_without_global_propagators(no_global_propagators: None) -> None:
    ctx = extract_context(HEADERS)
    assert _ids(ctx) == (TRACE, SPAN) and step_number(ctx) == 7


class _BrokenHeaders(dict[str, str]):
    """Fault injection (a stand-in, not vLLM's type): headers that fail when read."""

    def get(self, key: str, default: Any = None) -> Any:
        raise RuntimeError("broken headers")


def test_vllm_hook_failure_never_fails_the_request(
    otel: OTelHarness, caplog: pytest.LogCaptureFixture
) -> None:
    telemetry = Telemetry(
        "vllm",
        otel.tracer_provider.get_tracer("tests.servers"),
        otel.meter_provider.get_meter("tests.servers"),
        RolloutConfig(),
    )
    wrapper = vllm_adapter.server_headers_wrapper(telemetry)
    answer = object()
    headers = _BrokenHeaders(HEADERS)
    before = otel_context.get_current()
    with caplog.at_level(logging.WARNING, logger="otel_rollout"):
        for _ in range(2):
            assert wrapper(lambda h: answer, None, (headers,), {}) is answer
    assert otel_context.get_current() == before  # nothing attached
    failures = [r for r in caplog.records if "vllm server context" in r.getMessage()]
    assert len(failures) == 1  # logged once


def test_vllm_hook_returns_vllms_value_and_attaches_the_callers_context() -> None:
    telemetry = Telemetry(
        "vllm",
        trace.NoOpTracerProvider().get_tracer("t"),
        NoOpMeterProvider().get_meter("t"),
        RolloutConfig(),
    )
    wrapper = vllm_adapter.server_headers_wrapper(telemetry)
    seen: list[Any] = []

    def get_trace_headers(headers: Any) -> Any:
        seen.append(headers)
        return {"traceparent": headers["traceparent"]}

    token = otel_context.attach(otel_context.Context())
    try:
        out = wrapper(get_trace_headers, None, (HEADERS,), {})
        assert out == {"traceparent": HEADERS["traceparent"]} and seen == [HEADERS]
        current = otel_context.get_current()
        assert _ids(current) == (TRACE, SPAN) and step_number(current) == 7
    finally:
        otel_context.detach(token)
