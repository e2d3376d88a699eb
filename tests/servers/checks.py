"""What every server test sends (the real ``openai`` client) and checks (spans on the wire).

A rollout client sends, per request, W3C ``traceparent`` (its step's trace, its own span id) and
``baggage: rollout.step=N``. The checks find each request's span by its parent and response id,
so a request span too many — or one in the wrong trace — fails them.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from testkit.engines import long_tail_lengths
from testkit.otlp_receiver import OTLPReceiver, attr
from testkit.servers import request_spans

if TYPE_CHECKING:
    import openai

KINDS = ("completion", "chat", "completion_stream", "chat_stream")
SERVER_KIND = 2  # opentelemetry.proto.trace.v1.Span.SpanKind.SPAN_KIND_SERVER


@dataclass
class Call:
    kind: str
    step: int | None
    trace_id: str | None
    span_id: str | None
    max_tokens: int
    response_id: str
    output_tokens: int


def client(url: str) -> openai.OpenAI:
    import openai  # the engine environments have it; the core one (which only collects) not

    return openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=120)


def _call(
    api: openai.OpenAI, model: str, kind: str, max_tokens: int, headers: dict[str, str] | None
) -> tuple[str, int]:
    """One request of ``kind``; (response id, completion tokens the client was told)."""
    common: dict[str, Any] = dict(
        model=model, max_tokens=max_tokens, temperature=1.0, extra_body={"ignore_eos": True}
    )
    if headers:
        common["extra_headers"] = headers
    stream = kind.endswith("_stream")
    if stream:
        common.update(stream=True, stream_options={"include_usage": True})
    if kind.startswith("chat"):
        out = api.chat.completions.create(
            messages=[{"role": "user", "content": "Tell me a story."}], **common
        )
    else:
        out = api.completions.create(prompt="Once upon a time", **common)
    if not stream:
        assert out.usage is not None
        return out.id, out.usage.completion_tokens
    response_id, usage = "", None
    for chunk in out:
        response_id = response_id or chunk.id
        usage = chunk.usage or usage
    assert usage is not None, "no usage chunk in the stream"
    return response_id, usage.completion_tokens


def send_rollout(url: str, model: str, steps: int = 3, per_step: int = 2) -> list[Call]:
    """``steps`` steps of ``per_step`` requests, each step in a trace of its own."""
    api = client(url)
    lengths = long_tail_lengths(steps * per_step, seed=3, low=4, high=48)
    calls = []
    for i, max_tokens in enumerate(lengths):
        step = 40 + i // per_step
        trace_id = step.to_bytes(2, "big").hex() + os.urandom(14).hex()
        span_id = os.urandom(8).hex()
        headers = {
            "traceparent": f"00-{trace_id}-{span_id}-01",
            "baggage": f"rollout.step={step},team=rl",
        }
        kind = KINDS[i % len(KINDS)]
        response_id, tokens = _call(api, model, kind, max_tokens, headers)
        calls.append(Call(kind, step, trace_id, span_id, max_tokens, response_id, tokens))
    return calls


def send_plain(url: str, model: str) -> Call:
    """A request without any trace header."""
    response_id, tokens = _call(client(url), model, "completion", 5, None)
    return Call("completion", None, None, None, 5, response_id, tokens)


def send_batch(url: str, model: str, prompts: int = 2, max_tokens: int = 6) -> Call:
    """One completions call with a list of prompts: one engine request (and span) per prompt."""
    trace_id, span_id = os.urandom(16).hex(), os.urandom(8).hex()
    out = client(url).completions.create(
        model=model,
        prompt=[f"prompt {i}" for i in range(prompts)],
        max_tokens=max_tokens,
        extra_body={"ignore_eos": True},
        extra_headers={"traceparent": f"00-{trace_id}-{span_id}-01", "baggage": "rollout.step=99"},
    )
    assert out.usage is not None
    return Call(
        "completion_batch", 99, trace_id, span_id, max_tokens, out.id, out.usage.completion_tokens
    )


def check_batch(receiver: OTLPReceiver, provider: str, call: Call, prompts: int = 2) -> None:
    """Each prompt of the call: its own request span, all children of the caller's span."""

    def mine(r: OTLPReceiver) -> list[Any]:
        return [s for s in request_spans(r, provider) if s.trace_id.hex() == call.trace_id]

    receiver.wait_for(lambda r: len(mine(r)) >= prompts, timeout=30)
    time.sleep(1.0)  # as in wait_spans: a span too many would be here by now
    spans = mine(receiver)
    assert len(spans) == prompts, [s.name for s in spans]
    by_id = {s.span_id.hex(): s for s in receiver.spans()}
    for span in spans:
        _check_parent(span, by_id, call.span_id, via_server_span=False)
    assert {attr(s.attributes, "rollout.step") for s in spans} == {99}
    assert (
        sum(attr(s.attributes, "gen_ai.usage.output_tokens") for s in spans)
        == call.output_tokens
        == prompts * call.max_tokens
    )


def _of(spans: list[Any], call: Call) -> list[Any]:
    return [
        s
        for s in spans
        if str(attr(s.attributes, "gen_ai.response.id") or "").startswith(call.response_id)
    ]


def wait_spans(receiver: OTLPReceiver, provider: str, calls: list[Call]) -> list[Any]:
    """Wait until every call has its request span, then a little longer for any extra one."""
    receiver.wait_for(lambda r: all(_of(request_spans(r, provider), c) for c in calls), timeout=30)
    time.sleep(1.0)  # > the batch processor's 200 ms delay: a second span would be here by now
    return request_spans(receiver, provider)


def _is_http_server_span(span: Any) -> bool:
    """A span of the HTTP layer in front of the engine: a SERVER span (ASGI/FastAPI
    instrumentation, or FastAPI's own telemetry in newer FastAPI releases) or one of FastAPI's
    operation spans (``fastapi.endpoint``, …)."""
    return bool(span.kind == SERVER_KIND or span.name.startswith("fastapi."))


def _http_ancestry(span: Any, by_id: dict[str, Any]) -> tuple[list[Any], str]:
    """(the spans above ``span`` in this server, the remote parent's span id or "" for a root)."""
    chain = []
    parent = span.parent_span_id.hex()
    while parent in by_id:
        chain.append(by_id[parent])
        parent = by_id[parent].parent_span_id.hex()
    return chain, parent


def _check_parent(
    span: Any, by_id: dict[str, Any], caller_span_id: str | None, via_server_span: bool
) -> None:
    """The request span's parent is the caller's span, or HTTP-layer spans that lead to it.

    Without server instrumentation a request span's parent is the caller's span itself — unless
    the web framework traces on its own (FastAPI's built-in telemetry, in newer FastAPI than
    vLLM 0.32's environment has), whose spans may then sit in between; nothing else may.
    """
    chain, remote = _http_ancestry(span, by_id)
    assert remote == (caller_span_id or ""), (caller_span_id, remote, [s.name for s in chain])
    assert all(_is_http_server_span(s) for s in chain), [s.name for s in chain]
    assert all(s.trace_id == span.trace_id for s in chain)
    if via_server_span:
        assert any(s.kind == SERVER_KIND for s in chain), [s.name for s in chain]


def check_joined(
    receiver: OTLPReceiver, provider: str, calls: list[Call], *, via_server_span: bool
) -> dict[str, Any]:
    """Each call: exactly one request span, in its trace, child of its span (through the server
    span there is one), with the output tokens the client was told and the step of its baggage."""
    spans = wait_spans(receiver, provider, calls)
    by_id = {s.span_id.hex(): s for s in receiver.spans()}
    found = {}
    for call in calls:
        assert call.output_tokens == call.max_tokens, call  # ignore_eos: the exact length
        mine = _of(spans, call)
        assert len(mine) == 1, (call, [(s.name, s.parent_span_id.hex()) for s in mine])
        span = mine[0]
        assert span.trace_id.hex() == call.trace_id, call
        _check_parent(span, by_id, call.span_id, via_server_span)
        assert attr(span.attributes, "gen_ai.usage.output_tokens") == call.output_tokens, call
        assert attr(span.attributes, "rollout.step") == call.step, call
        found[call.response_id] = span
    # Nothing else of ours in the callers' traces: one request span per request.
    traces = {c.trace_id for c in calls}
    assert len([s for s in spans if s.trace_id.hex() in traces]) == len(calls)
    return found


def check_root(receiver: OTLPReceiver, provider: str, call: Call, *, via_server_span: bool) -> None:
    """A request without headers: one request span, a root (or under a root server span)."""
    spans = wait_spans(receiver, provider, [call])
    mine = _of(spans, call)
    assert len(mine) == 1, mine
    span = mine[0]
    assert attr(span.attributes, "gen_ai.usage.output_tokens") == call.output_tokens
    assert attr(span.attributes, "rollout.step") is None
    _check_parent(span, {s.span_id.hex(): s for s in receiver.spans()}, None, via_server_span)
