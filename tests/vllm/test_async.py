"""AsyncLLM.generate on the real vLLM engine: one span per streamed request, every way a stream ends."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.trace import StatusCode

from otel_rollout import rollout_step
from tests.conftest import OTelHarness

pytestmark = pytest.mark.vllm


def _spans(otel: OTelHarness) -> list[Any]:
    return [s for s in otel.finished_spans() if s.attributes.get("gen_ai.provider.name") == "vllm"]


def _active(otel: OTelHarness) -> float:
    return sum(p.value for p in otel.metric_points("rollout.requests.active"))


async def _consume(engine: Any, vllm_module: Any, rid: str, n: int) -> tuple[int, int]:
    params = vllm_module.SamplingParams(max_tokens=n, ignore_eos=True)
    chunks, tokens = 0, 0
    async for out in engine.generate(f"prompt {rid}", params, rid):
        chunks += 1
        tokens = len(out.outputs[0].token_ids)
    return chunks, tokens


def test_concurrent_streams_one_span_each(
    otel: OTelHarness, engine: Any, vllm_module: Any, loop: asyncio.AbstractEventLoop
) -> None:
    lengths = {f"req-{i}": 4 + 7 * i for i in range(10)}
    tracer = trace.get_tracer("test")

    async def run() -> list[tuple[int, int]]:
        with tracer.start_as_current_span("trainer"):
            async with rollout_step(3):
                return await asyncio.gather(
                    *(_consume(engine, vllm_module, rid, n) for rid, n in lengths.items())
                )

    results = loop.run_until_complete(run())
    assert [tokens for _, tokens in results] == list(lengths.values())
    spans = _spans(otel)
    assert len(spans) == len(lengths)
    (step_span,) = [s for s in otel.finished_spans() if s.name == "rollout.step"]
    for span in spans:
        rid = span.attributes["gen_ai.response.id"]
        assert span.attributes["gen_ai.usage.output_tokens"] == lengths[rid]
        assert span.parent.span_id == step_span.context.span_id
        assert span.attributes["rollout.step"] == 3
        assert span.attributes["rollout.timing.source"] == "engine"
        assert span.status.status_code == StatusCode.UNSET
        (event,) = [e for e in span.events if e.name == "gen_ai.first_token"]
        assert span.start_time < event.timestamp <= span.end_time
    durations = otel.metric_points("gen_ai.server.request.duration")
    assert sum(p.count for p in durations) == len(lengths)
    ids = {(s.context.trace_id, s.context.span_id) for s in spans}
    assert all((e.trace_id, e.span_id) in ids for p in durations for e in p.exemplars)
    assert _active(otel) == 0


def test_early_break_and_aclose_end_span_once(
    otel: OTelHarness, engine: Any, vllm_module: Any, loop: asyncio.AbstractEventLoop
) -> None:
    params = vllm_module.SamplingParams(max_tokens=200, ignore_eos=True)

    async def run() -> None:
        stream = engine.generate("break me", params, "early-break")
        async for _ in stream:
            break
        await stream.aclose()
        await stream.aclose()  # a second close changes nothing
        closing = engine.generate("close me", params, "early-aclose")
        await closing.__anext__()
        await closing.aclose()

    loop.run_until_complete(run())
    spans = {s.attributes["gen_ai.response.id"]: s for s in _spans(otel)}
    assert set(spans) == {"early-break", "early-aclose"}
    for span in spans.values():
        assert span.status.status_code == StatusCode.ERROR
        assert span.attributes["error.type"] == "StreamClosedEarly"
        assert span.attributes["gen_ai.usage.output_tokens"] < 200
    points = otel.metric_points("gen_ai.server.request.duration")
    assert sum(p.count for p in points) == 2
    assert {p.attributes["rollout.finish_reason"] for p in points} == {"abort"}
    assert _active(otel) == 0


def test_cancel_and_engine_abort(
    otel: OTelHarness, engine: Any, vllm_module: Any, loop: asyncio.AbstractEventLoop
) -> None:
    params = vllm_module.SamplingParams(max_tokens=500, ignore_eos=True)

    async def consume(rid: str, started: asyncio.Event) -> int:
        tokens = 0
        async for out in engine.generate(f"p {rid}", params, rid):
            started.set()
            tokens = len(out.outputs[0].token_ids)
        return tokens

    async def run() -> tuple[BaseException | int, int]:
        cancel_started, abort_started = asyncio.Event(), asyncio.Event()
        cancelled = asyncio.create_task(consume("cancelled", cancel_started))
        aborted = asyncio.create_task(consume("aborted", abort_started))
        await cancel_started.wait()
        await abort_started.wait()
        cancelled.cancel()
        await engine.abort("aborted")
        results = await asyncio.gather(cancelled, aborted, return_exceptions=True)
        return results[0], results[1]

    cancel_result, abort_result = loop.run_until_complete(run())
    assert isinstance(cancel_result, asyncio.CancelledError)
    spans = {s.attributes["gen_ai.response.id"]: s for s in _spans(otel)}
    assert set(spans) == {"cancelled", "aborted"}
    assert spans["cancelled"].attributes["error.type"] == "CancelledError"
    aborted = spans["aborted"]
    if isinstance(abort_result, BaseException):
        assert aborted.attributes["error.type"] == type(abort_result).__qualname__
    else:
        assert aborted.attributes["gen_ai.response.finish_reasons"] == ("abort",)
    points = otel.metric_points("gen_ai.server.request.duration")
    assert sum(p.count for p in points) == 2
    assert {p.attributes["rollout.finish_reason"] for p in points} == {"abort"}
    assert _active(otel) == 0


def test_engine_error_reaches_caller_unmodified(
    otel: OTelHarness, engine: Any, vllm_module: Any, loop: asyncio.AbstractEventLoop
) -> None:
    params = vllm_module.SamplingParams(max_tokens=4)

    async def run() -> BaseException:
        try:
            async for _ in engine.generate("x " * 5000, params, "too-long"):
                pass
        except Exception as exc:  # the engine's own rejection
            return exc
        raise AssertionError("vLLM accepted a prompt longer than max_model_len")

    error = loop.run_until_complete(run())
    assert "otel_rollout" not in "".join(type(error).__module__)
    (span,) = _spans(otel)
    assert span.status.status_code == StatusCode.ERROR
    assert span.attributes["error.type"] == type(error).__qualname__
    assert _active(otel) == 0


def test_trace_headers_left_alone_when_vllm_tracing_off(engine: Any) -> None:
    """vLLM logs a warning for headers it cannot use; we only inject where it traces."""
    from otel_rollout.vllm.adapter import _tracing_enabled

    assert engine.observability_config.otlp_traces_endpoint is None
    assert not _tracing_enabled(engine)
