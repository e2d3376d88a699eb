"""The HTTP client hook's translation (``otel_rollout.http.adapter``), on real ``httpx`` objects.

What the engine servers send is covered end to end in ``tests/servers/test_http_client_*.py``
(real vLLM and SGLang servers); here, the cases those servers cannot be made to produce on
demand: bodies split anywhere across stream chunks, several choices, a batch of native requests,
HTTP errors, compressed streams, and the requests the hook must leave alone.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from opentelemetry import baggage
from opentelemetry import context as otel_context

from otel_rollout.context import with_step
from otel_rollout.http.adapter import ClientCall, EngineHTTPError, operation_of
from otel_rollout.propagation import extract_context, server_context, tracestate_step
from otel_rollout.record import RequestRecord

PATHS = ("/v1/completions", "/v1/chat/completions", "/generate")


class Collector:
    """A step as the hook sees one (the ``StepCollector`` protocol): a number and a list."""

    def __init__(self, step: int = 4) -> None:
        self.step = step
        self.records: list[RequestRecord] = []

    def observe(self, record: RequestRecord) -> None:
        self.records.append(record)


@pytest.fixture
def step() -> Any:
    collector = Collector()
    token = otel_context.attach(with_step(collector, otel_context.get_current()))
    yield collector
    otel_context.detach(token)


def post(path: str, headers: dict[str, str] | None = None) -> httpx.Request:
    return httpx.Request("POST", f"http://engine:8000{path}", json={"x": 1}, headers=headers)


def sse(*events: Any) -> bytes:
    out = b""
    for event in events:
        data = event if isinstance(event, bytes) else json.dumps(event, separators=(",", ":"))
        out += b"data: " + (data.encode() if isinstance(data, str) else data) + b"\n\n"
    return out


def test_only_engine_posts_inside_a_step_are_touched(step: Collector) -> None:
    assert operation_of("/router/v1/chat/completions", PATHS) == "chat"
    assert operation_of("/v1/completions", PATHS) == "text_completion"
    assert operation_of("/v1/models", PATHS) is None
    assert ClientCall.start(httpx.Request("GET", "http://e/v1/completions"), PATHS) is None
    assert ClientCall.start(post("/health"), PATHS) is None
    request = post("/v1/completions")
    assert ClientCall.start(request, PATHS) is not None
    assert "traceparent" not in request.headers  # no valid span here: nothing to continue
    assert request.headers["baggage"] == "rollout.step=4"
    assert request.headers["tracestate"] == "rollout_step=4"


def test_outside_a_step_nothing_happens() -> None:
    request = post("/v1/completions")
    assert ClientCall.start(request, PATHS) is None
    assert "baggage" not in request.headers


def test_a_callers_own_headers_are_kept(step: Collector) -> None:
    mine = {"traceparent": "00-" + "ab" * 16 + "-" + "cd" * 8 + "-01", "baggage": "team=rl"}
    request = post("/v1/completions", mine)
    assert ClientCall.start(request, PATHS) is not None
    assert request.headers["traceparent"] == mine["traceparent"]
    assert request.headers["baggage"] == "team=rl"


def test_the_step_also_rides_in_tracestate_for_a_router_that_drops_baggage(
    step: Collector,
) -> None:
    """sglang-router forwards ``traceparent``, ``tracestate`` and ``x-request-id`` only (tried
    on 0.3.2; tests/slime runs the real router): the server reads the step from our entry."""
    request = post("/generate", {"tracestate": "ot=th:8,rollout_step=2,vendor=v"})
    assert ClientCall.start(request, PATHS) is not None
    # ours updated and moved first; the other vendors' entries kept in their order
    assert request.headers["tracestate"] == "rollout_step=4,ot=th:8,vendor=v"
    forwarded = {"traceparent": "00-" + "ab" * 16 + "-" + "cd" * 8 + "-01"}
    forwarded["tracestate"] = request.headers["tracestate"]
    assert baggage.get_baggage("rollout.step", extract_context(forwarded)) == "4"
    # where baggage did get through, it is what counts
    both = {**forwarded, "baggage": "rollout.step=9"}
    assert baggage.get_baggage("rollout.step", extract_context(both)) == "9"
    # server_context takes it as the baggage entry the server would have read
    ctx = server_context(forwarded, otel_context.Context())
    assert ctx is not None and baggage.get_baggage("rollout.step", ctx) == "4"


def test_a_tracestate_that_does_not_parse_is_left_alone(step: Collector) -> None:
    request = post("/generate", {"tracestate": "not a list member"})
    assert ClientCall.start(request, PATHS) is not None
    assert request.headers["tracestate"] == "not a list member"
    assert tracestate_step("rollout_step=x") is None
    assert tracestate_step("other=1") is None
    assert tracestate_step(None) is None


def test_openai_body_with_several_choices_and_cached_tokens(step: Collector) -> None:
    call = ClientCall.start(post("/v1/completions"), PATHS)
    assert call is not None
    body = {
        "id": "cmpl-1",
        "model": "/models/models--Qwen--Qwen2.5-7B/snapshots/abc",
        "choices": [
            {"index": 1, "text": "b", "finish_reason": "stop"},
            {"index": 0, "text": "a", "finish_reason": "length"},
        ],
        "usage": {
            "prompt_tokens": 5,
            "completion_tokens": 19,
            "prompt_tokens_details": {"cached_tokens": 4},
        },
    }
    call.finished(httpx.Response(200, json=body))
    (record,) = step.records
    assert (record.request_id, record.model, record.operation) == (
        "cmpl-1",
        "Qwen/Qwen2.5-7B",
        "text_completion",
    )
    assert (record.prompt_tokens, record.output_tokens, record.cached_tokens) == (5, 19, 4)
    assert record.finish_reasons == ("length", "stop") and record.n == 2
    assert record.timing_source == "client" and record.provider == "openai"
    assert record.first_token_ns is None and record.error is None


def test_native_batch_is_one_record_per_prompt(step: Collector) -> None:
    call = ClientCall.start(post("/generate"), PATHS)
    assert call is not None
    body = [
        {
            "text": "x",
            "meta_info": {
                "id": "a",
                "prompt_tokens": 3,
                "completion_tokens": 8,
                "cached_tokens": 0,
                "finish_reason": {"type": "length", "length": 8},
            },
        },
        {
            "text": "y",
            "meta_info": {
                "id": "b",
                "prompt_tokens": 4,
                "completion_tokens": 2,
                "finish_reason": {"type": "stop", "matched": 2},
            },
        },
    ]
    call.finished(httpx.Response(200, json=body))
    assert [(r.request_id, r.output_tokens, r.finish_reasons) for r in step.records] == [
        ("a", 8, ("length",)),
        ("b", 2, ("stop",)),
    ]
    assert {r.provider for r in step.records} == {"sglang"}


def test_http_error_and_client_failure_are_counted_as_errors(step: Collector) -> None:
    call = ClientCall.start(post("/v1/chat/completions"), PATHS)
    assert call is not None
    call.finished(httpx.Response(503, text="overloaded"))
    call.end(None)  # a second end of the same call changes nothing
    failed = ClientCall.start(post("/v1/chat/completions"), PATHS)
    assert failed is not None
    failed.end(httpx.ConnectError("refused"))
    first, second = step.records
    assert isinstance(first.error, EngineHTTPError) and first.finish_reason == "error"
    assert isinstance(second.error, httpx.ConnectError) and second.operation == "chat"


def test_openai_stream_split_anywhere(step: Collector) -> None:
    body = sse(
        {
            "id": "c1",
            "model": "m",
            "choices": [{"index": 0, "text": "a", "finish_reason": None}],
            "usage": None,
        },
        {
            "id": "c1",
            "model": "m",
            "choices": [{"index": 0, "text": "b", "finish_reason": "length"}],
            "usage": None,
        },
        {
            "id": "c1",
            "model": "m",
            "choices": [],
            "usage": {"prompt_tokens": 2, "completion_tokens": 2},
        },
        b"[DONE]",
    )
    for size in (1, 7, len(body)):
        step.records.clear()
        call = ClientCall.start(post("/v1/completions"), PATHS)
        assert call is not None
        for i in range(0, len(body), size):
            call.feed(body[i : i + size])
        call.end(None)
        (record,) = step.records
        assert (record.request_id, record.output_tokens, record.finish_reasons) == (
            "c1",
            2,
            ("length",),
        )
        assert record.first_token_ns is not None and record.error is None


def test_stream_without_usage_has_no_token_count(step: Collector) -> None:
    call = ClientCall.start(post("/v1/chat/completions"), PATHS)
    assert call is not None
    call.feed(
        sse(
            {
                "id": "c2",
                "choices": [{"index": 0, "delta": {"content": "hi"}, "finish_reason": "stop"}],
            },
            b"[DONE]",
        )
    )
    call.end(None)
    (record,) = step.records
    assert record.output_tokens is None and record.finish_reasons == ("stop",)


def test_native_stream_takes_the_last_cumulative_event(step: Collector) -> None:
    call = ClientCall.start(post("/generate"), PATHS)
    assert call is not None
    events = [
        {"text": "a" * k, "meta_info": {"id": "s", "completion_tokens": k, "finish_reason": None}}
        for k in (1, 2, 3)
    ]
    events[-1]["meta_info"]["finish_reason"] = {"type": "length", "length": 3}
    call.feed(sse(*events, b"[DONE]"))
    call.end(None)
    (record,) = step.records
    assert (record.request_id, record.output_tokens, record.finish_reasons) == ("s", 3, ("length",))


def test_a_stream_closed_before_its_end_is_an_abort(step: Collector) -> None:
    call = ClientCall.start(post("/v1/completions"), PATHS)
    assert call is not None
    call.feed(sse({"id": "c3", "choices": [{"index": 0, "text": "a", "finish_reason": None}]}))
    call.end(None)
    (record,) = step.records
    assert record.finish_reason == "abort" and record.first_token_ns is not None


def test_a_compressed_stream_is_timed_not_read(step: Collector) -> None:
    call = ClientCall.start(post("/v1/completions"), PATHS)
    assert call is not None
    call.readable = False
    call.feed(b"\x1f\x8b\x08\x00 compressed bytes")
    call.end(None)
    (record,) = step.records
    assert record.error is None and record.output_tokens is None and record.first_token_ns
