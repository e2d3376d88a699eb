"""The real SGLang CPU engine with its default settings (``enable_metrics`` off).

Engine.generate / async_generate (single, batch, input_ids, n > 1, streamed), the server path
(``TokenizerManager.generate_request``), early exit, engine errors, trace-header injection, and
uninstrument.
"""

from __future__ import annotations

import asyncio
import gc
import logging
from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.trace import StatusCode

from otel_rollout import rollout_step
from otel_rollout.semconv import STEP_SPAN_NAME
from otel_rollout.sglang import adapter
from tests.conftest import OTelHarness
from tests.sglang.conftest import start_engine
from tests.sglang.helpers import (
    TOLERANCE_NS,
    assert_matches,
    batch_spans,
    in_flight,
    params,
    request_spans,
    spans_by_id,
)

pytestmark = pytest.mark.sglang


@pytest.fixture(scope="module")
def engine(sglang_module: Any, tiny_model: str, instrumented: Any) -> Iterator[Any]:
    eng = start_engine(sglang_module, tiny_model)
    yield eng
    eng.shutdown()


def test_single_and_batch_nest_under_caller_and_step(otel: OTelHarness, engine: Any) -> None:
    tracer = trace.get_tracer("test")
    lengths = [4, 9, 2, 16]
    with tracer.start_as_current_span("caller") as caller, rollout_step(1):
        single = engine.generate(prompt="def f():", sampling_params=params(5))
        outs = engine.generate(
            prompt=[f"import m{i}" for i in range(len(lengths))],
            sampling_params=[params(n, temperature=0.5) for n in lengths],
        )

    spans = request_spans(otel)
    assert len(spans) == 1 + len(lengths)  # Engine → generate_request is counted once
    (step,) = [s for s in otel.finished_spans() if s.name == STEP_SPAN_NAME]
    (batch,) = batch_spans(otel)
    assert step.parent.span_id == caller.get_span_context().span_id
    assert batch.parent.span_id == step.context.span_id
    assert batch.attributes["rollout.batch.size"] == len(lengths)
    by_id = spans_by_id(otel)

    span = by_id[single["meta_info"]["id"]]
    assert span.parent.span_id == step.context.span_id
    assert_matches(span, single, len(single["output_ids"]))
    for out, n in zip(outs, lengths, strict=False):
        span = by_id[out["meta_info"]["id"]]
        assert span.parent.span_id == batch.context.span_id
        assert len(out["output_ids"]) == n
        assert_matches(span, out, len(out["output_ids"]))
        assert span.attributes["gen_ai.request.max_tokens"] == n
        assert span.attributes["gen_ai.request.temperature"] == 0.5
        assert span.attributes["rollout.step"] == 1
        # Metrics off: the engine's own e2e latency is the span's duration.
        assert span.attributes["rollout.timing.source"] == "engine_latency"
        assert abs(span.end_time - span.start_time - out["meta_info"]["e2e_latency"] * 1e9) <= 2
        assert batch.start_time - TOLERANCE_NS <= span.start_time
        assert span.end_time <= batch.end_time + TOLERANCE_NS

    durations = otel.metric_points("gen_ai.server.request.duration")
    assert sum(p.count for p in durations) == len(spans)
    assert all(p.attributes["rollout.finish_reason"] == "length" for p in durations)
    tokens = [
        p
        for p in otel.metric_points("gen_ai.client.token.usage")
        if p.attributes["gen_ai.token.type"] == "output"
    ]
    assert sum(p.count for p in tokens) == len(spans)
    assert sum(p.sum for p in tokens) == 5 + sum(lengths)
    span_ids = {(s.context.trace_id, s.context.span_id) for s in spans}
    exemplars = [e for p in durations for e in p.exemplars]
    assert exemplars, "histogram points carry exemplars"
    assert all((e.trace_id, e.span_id) in span_ids for e in exemplars)
    assert in_flight(otel) == 0


def test_input_ids_batch_and_parallel_samples(otel: OTelHarness, engine: Any) -> None:
    ids = [[1, 2, 3], [4, 5, 6, 7]]
    outs = engine.generate(input_ids=ids, sampling_params=params(3))
    samples = engine.generate(prompt="x =", sampling_params=params(4, n=2))

    assert len(samples) == 2  # SGLang turns n > 1 into a batch of n requests
    by_id = spans_by_id(otel)
    assert len(by_id) == 4
    batches = batch_spans(otel)
    assert sorted(b.attributes["rollout.batch.size"] for b in batches) == [2, 2]
    for out, prompt in zip(outs, ids, strict=False):
        span = by_id[out["meta_info"]["id"]]
        assert span.attributes["gen_ai.usage.input_tokens"] == len(prompt)
        assert_matches(span, out, len(out["output_ids"]))
    for out in samples:
        span = by_id[out["meta_info"]["id"]]
        assert_matches(span, out, 4)
        assert span.attributes["gen_ai.request.choice.count"] == 2
    batch_ids = {b.context.span_id for b in batches}
    assert {s.parent.span_id for s in by_id.values()} == batch_ids
    assert in_flight(otel) == 0


def test_sync_streams_single_and_batch(otel: OTelHarness, engine: Any) -> None:
    lengths: list[int] = []
    for chunk in engine.generate(prompt="class A:", stream=True, sampling_params=params(6)):
        lengths.append(len(chunk["output_ids"]))  # one list, mutated in place: take it now
        last = chunk
    (span,) = request_spans(otel)
    assert_matches(span, last, lengths[-1])
    assert lengths[-1] == 6
    assert not batch_spans(otel)
    (event,) = [e for e in span.events if e.name == "gen_ai.first_token"]
    assert span.start_time <= event.timestamp <= span.end_time

    otel.reset()
    finals: dict[int, tuple[int, dict[str, Any]]] = {}
    for chunk in engine.generate(
        prompt=["a = 1", "b = 2"], stream=True, sampling_params=[params(3), params(7)]
    ):
        finals[chunk["index"]] = (len(chunk["output_ids"]), chunk)
    by_id = spans_by_id(otel)
    (batch,) = batch_spans(otel)
    assert len(by_id) == 2
    for index, (count, chunk) in finals.items():
        span = by_id[chunk["meta_info"]["id"]]
        assert count == [3, 7][index]
        assert_matches(span, chunk, count)
        assert span.parent.span_id == batch.context.span_id
        assert span.end_time <= batch.end_time
    assert in_flight(otel) == 0


def test_async_generate_single_gather_and_streams(otel: OTelHarness, engine: Any) -> None:
    tracer = trace.get_tracer("test")

    async def run() -> tuple[list[Any], int, dict[int, int]]:
        outs = await asyncio.gather(
            *(
                engine.async_generate(prompt=f"x{i} =", rid=f"async-{i}", sampling_params=params(5))
                for i in range(3)
            )
        )
        stream = await engine.async_generate(prompt="y =", stream=True, sampling_params=params(4))
        streamed = 0
        async for chunk in stream:
            streamed = len(chunk["output_ids"])
        batch = await engine.async_generate(
            prompt=["p", "q"], stream=True, sampling_params=params(2)
        )
        per_index: dict[int, int] = {}
        async for chunk in batch:
            per_index[chunk["index"]] = len(chunk["output_ids"])
        return outs, streamed, per_index

    with tracer.start_as_current_span("caller") as caller:
        outs, streamed, per_index = engine.loop.run_until_complete(run())

    assert streamed == 4 and per_index == {0: 2, 1: 2}
    spans = request_spans(otel)
    assert len(spans) == 3 + 1 + 2
    by_id = spans_by_id(otel)
    for i, out in enumerate(outs):
        span = by_id[f"async-{i}"]
        assert_matches(span, out, len(out["output_ids"]))
        assert span.parent.span_id == caller.get_span_context().span_id
    (batch,) = batch_spans(otel)
    assert batch.parent.span_id == caller.get_span_context().span_id
    assert sum(s.parent.span_id == batch.context.span_id for s in spans) == 2
    assert sum(s.attributes["gen_ai.usage.output_tokens"] for s in spans) == 15 + 4 + 4
    assert in_flight(otel) == 0


def test_stream_early_exit_ends_span_once(otel: OTelHarness, engine: Any) -> None:
    async def run() -> None:
        stream = await engine.async_generate(prompt="z =", stream=True, sampling_params=params(64))
        async for _ in stream:
            break
        await stream.aclose()
        await stream.aclose()  # closing twice must not end the span twice

    engine.loop.run_until_complete(run())
    (span,) = request_spans(otel)
    assert span.attributes["error.type"] == "StreamClosedEarly"
    assert span.status.status_code is StatusCode.ERROR
    assert span.attributes["rollout.timing.source"] == "observed"
    (point,) = otel.metric_points("gen_ai.server.request.duration")
    assert point.count == 1 and point.attributes["rollout.finish_reason"] == "abort"
    assert in_flight(otel) == 0

    # A task cancelled while it awaits its (non-streamed) result.
    otel.reset()

    async def cancel() -> None:
        task = asyncio.ensure_future(
            engine.async_generate(prompt="c =", rid="cancelled", sampling_params=params(256))
        )
        await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    engine.loop.run_until_complete(cancel())
    (span,) = request_spans(otel)
    assert span.attributes["error.type"] == "CancelledError"
    assert span.attributes["gen_ai.response.id"] == "cancelled"
    (point,) = otel.metric_points("gen_ai.server.request.duration")
    assert point.attributes["rollout.finish_reason"] == "abort"
    assert in_flight(otel) == 0

    # The sync stream, abandoned: Engine never closes it; dropping it ends the request.
    otel.reset()
    for _ in engine.generate(prompt="w =", stream=True, sampling_params=params(64)):
        break
    gc.collect()
    (span,) = request_spans(otel)
    assert span.attributes["error.type"] == "StreamClosedEarly"
    assert in_flight(otel) == 0


def test_server_path_generate_request(otel: OTelHarness, engine: Any) -> None:
    from sglang.srt.managers.io_struct import GenerateReqInput

    tracer = trace.get_tracer("test")
    manager = engine.tokenizer_manager
    with tracer.start_as_current_span("caller") as caller:
        # verl's server adapter: one __anext__ on the generator, never exhausted.
        one = engine.loop.run_until_complete(
            manager.generate_request(
                GenerateReqInput(text="hello", sampling_params=params(3)), None
            ).__anext__()
        )
        many = engine.loop.run_until_complete(
            manager.generate_request(
                GenerateReqInput(text=["a", "b", "c"], sampling_params=params(2)), None
            ).__anext__()
        )

    assert len(many) == 3
    by_id = spans_by_id(otel)
    assert len(by_id) == 4
    assert not batch_spans(otel)  # outside Engine: one span per element, in the caller's context
    for out in [one, *many]:
        span = by_id[out["meta_info"]["id"]]
        assert_matches(span, out, len(out["output_ids"]))
        assert span.parent.span_id == caller.get_span_context().span_id
    assert in_flight(otel) == 0


def test_engine_errors_reach_the_caller_unchanged(
    otel: OTelHarness, engine: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(ValueError, match="top_p"):
        engine.generate(prompt="x", sampling_params=params(3, top_p=5.0))
    (span,) = request_spans(otel)
    assert span.attributes["error.type"] == "ValueError"
    assert span.attributes["gen_ai.response.id"]  # SGLang had assigned it before it failed
    assert span.status.status_code is StatusCode.ERROR
    assert in_flight(otel) == 0

    otel.reset()
    with pytest.raises(ValueError, match="top_p"):
        engine.generate(prompt=["x", "y"], sampling_params=params(3, top_p=5.0))
    spans = request_spans(otel)
    (batch,) = batch_spans(otel)
    assert len(spans) == 2
    assert all(s.attributes["error.type"] == "ValueError" for s in spans)
    assert batch.attributes["error.type"] == "ValueError"
    (point,) = otel.metric_points("gen_ai.server.request.duration")
    assert point.count == 2 and point.attributes["rollout.finish_reason"] == "error"
    assert in_flight(otel) == 0

    # The very object the engine raised, in both Engine paths.
    boom = RuntimeError("engine failed")

    async def fail(obj: Any) -> None:
        raise boom

    monkeypatch.setattr(engine.tokenizer_manager, "_validate_and_resolve_lora", fail)
    with pytest.raises(RuntimeError) as sync_info:
        engine.generate(prompt="x", sampling_params=params(3))
    with pytest.raises(RuntimeError) as async_info:
        engine.loop.run_until_complete(engine.async_generate(prompt="x", sampling_params=params(3)))
    assert sync_info.value is boom and async_info.value is boom
    assert in_flight(otel) == 0


def test_trace_header_injected_only_where_sglang_reads_it(
    otel: OTelHarness, engine: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from sglang.srt.managers.io_struct import GenerateReqInput

    tracer = trace.get_tracer("test")
    manager = engine.tokenizer_manager

    def run(obj: Any) -> None:
        engine.loop.run_until_complete(manager.generate_request(obj, None).__anext__())

    assert not manager.enable_trace
    plain = GenerateReqInput(text="a", sampling_params=params(1))
    run(plain)
    assert plain.external_trace_header is None  # SGLang's tracing is off: nothing to join

    monkeypatch.setattr(adapter, "_tracing_enabled", lambda manager: True)
    with tracer.start_as_current_span("caller") as caller:
        injected = GenerateReqInput(text="a", sampling_params=params(1))
        run(injected)
        given = {"traceparent": f"00-{'1' * 32}-{'2' * 16}-01"}
        kept = GenerateReqInput(
            text="a", sampling_params=params(1), external_trace_header=dict(given)
        )
        run(kept)
    trace_id = format(caller.get_span_context().trace_id, "032x")
    span_id = format(caller.get_span_context().span_id, "016x")
    assert injected.external_trace_header["traceparent"].startswith(f"00-{trace_id}-{span_id}-")
    assert kept.external_trace_header == given
    assert len(request_spans(otel)) == 3


def test_uninstrument_restores_originals(
    otel: OTelHarness,
    engine: Any,
    instrumented: Any,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    from sglang.srt.entrypoints.engine import Engine
    from sglang.srt.managers.tokenizer_manager import TokenizerManager

    import otel_rollout.instrumentation as shared_instrumentation

    names = [
        (Engine, "generate"),
        (Engine, "async_generate"),
        (Engine, "__init__"),
        (TokenizerManager, "generate_request"),
    ]
    originals = {name: vars(owner)[name].__wrapped__ for owner, name in names}
    instrumented.uninstrument()
    try:
        for owner, name in names:
            assert vars(owner)[name] is originals[name]
        engine.generate(prompt="x", sampling_params=params(2))
        assert not otel.finished_spans()

        # An unsupported version (below 0.4.9): one clear log line, nothing patched, no exception.
        monkeypatch.setattr(shared_instrumentation, "module_version", lambda name: "0.4.8")
        with caplog.at_level(logging.WARNING, logger="otel_rollout.instrumentation"):
            instrumented.instrument()
        (record,) = [r for r in caplog.records if r.name == "otel_rollout.instrumentation"]
        assert "0.4.8" in record.getMessage() and "not instrumented" in record.getMessage()
        for owner, name in names:
            assert vars(owner)[name] is originals[name]
        instrumented.uninstrument()
    finally:
        monkeypatch.undo()
        instrumented.instrument()
    assert vars(TokenizerManager)["generate_request"].__wrapped__ is originals["generate_request"]
