"""Our own telemetry failing must never change or stop the engine's work.

FAULT INJECTION throughout: a meter instrument whose ``record``/``add`` raises, and a span
processor whose ``on_start``/``on_end`` raises (added to the session's TracerProvider, switched
on only inside these tests). The reference result is the same seeded call with instrumentation
suppressed.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry.instrumentation.utils import suppress_instrumentation
from opentelemetry.sdk.trace import SpanProcessor

from otel_rollout.telemetry import LogOnce
from testkit.engines import vllm_telemetry
from tests.conftest import OTelHarness, flush_emitters
from tests.reliability.helpers import active_delta, in_flight, request_spans

pytestmark = pytest.mark.vllm


class _FaultyInstrument:
    """FAULT INJECTION: every call raises."""

    def __init__(self, what: str) -> None:
        self.what = what

    def record(self, *args: Any, **kwargs: Any) -> None:
        raise RuntimeError(f"FAULT INJECTION: {self.what}.record")

    def add(self, *args: Any, **kwargs: Any) -> None:
        raise RuntimeError(f"FAULT INJECTION: {self.what}.add")

    def __call__(self, *args: Any, **kwargs: Any) -> None:
        raise RuntimeError(f"FAULT INJECTION: {self.what}")


# The in-flight count is an observable fed from Telemetry's per-engine activity: its fault is
# in the accounting every request goes through (``Telemetry.engine_activity``), not in an
# instrument.
_TARGET = {"active": "engine_activity"}


class _FaultySpanProcessor(SpanProcessor):
    """FAULT INJECTION: raises in on_start / on_end while ``mode`` says so."""

    mode: str | None = None

    def on_start(self, span: Any, parent_context: Any = None) -> None:
        if self.mode == "start":
            raise RuntimeError("FAULT INJECTION: span processor on_start")

    def on_end(self, span: Any) -> None:
        if self.mode == "end":
            raise RuntimeError("FAULT INJECTION: span processor on_end")


_PROCESSOR = _FaultySpanProcessor()


@pytest.fixture
def faulty_processor(otel: OTelHarness) -> Iterator[_FaultySpanProcessor]:
    if not getattr(otel, "_faulty_processor_added", False):
        otel.tracer_provider.add_span_processor(_PROCESSOR)
        otel._faulty_processor_added = True  # type: ignore[attr-defined]
    yield _PROCESSOR
    _PROCESSOR.mode = None


@pytest.fixture
def fresh_log(monkeypatch: pytest.MonkeyPatch) -> Any:
    """A fresh log-once state, so an earlier test's logged failure does not hide this one's."""
    telemetry = vllm_telemetry()
    monkeypatch.setattr(telemetry, "log", LogOnce())
    return telemetry


def _batch(vllm_module: Any, tag: str) -> tuple[list[str], list[Any]]:
    prompts = [f"{tag} prompt {i}" for i in range(5)]
    params = [
        vllm_module.SamplingParams(max_tokens=6, temperature=1.0, seed=100 + i) for i in range(5)
    ]
    return prompts, params


def _tokens(outputs: Any) -> list[list[int]]:
    return [list(o.outputs[0].token_ids) for o in outputs]


def _failures(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [
        r
        for r in caplog.records
        if r.name.startswith("otel_rollout")
        and r.levelno >= logging.WARNING
        and "telemetry failed" in r.getMessage()
    ]


def _two_batches_equal_reference(llm: Any, vllm_module: Any) -> None:
    for tag in ("first", "second"):
        prompts, params = _batch(vllm_module, tag)
        with suppress_instrumentation():
            reference = llm.generate(prompts, params, use_tqdm=False)
        outputs = llm.generate(prompts, params, use_tqdm=False)
        flush_emitters()  # spans and points are made on the emitter's thread: the fault is there
        assert _tokens(outputs) == _tokens(reference)
        assert [o.request_id for o in outputs] == sorted((o.request_id for o in outputs), key=int)


@pytest.mark.parametrize("instrument", ["duration", "tokens", "active"])
def test_broken_instrument_offline(
    instrument: str,
    otel: OTelHarness,
    llm: Any,
    vllm_module: Any,
    fresh_log: Any,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.setattr(
        fresh_log, _TARGET.get(instrument, instrument), _FaultyInstrument(instrument)
    )  # FAULT INJECTION
    with caplog.at_level(logging.WARNING):
        _two_batches_equal_reference(llm, vllm_module)
    failures = _failures(caplog)
    assert len(failures) == 1, [r.getMessage() for r in failures]  # once, not per request
    assert f"FAULT INJECTION: {instrument}" in caplog.text
    monkeypatch.undo()

    # Later requests still work, with full telemetry.
    otel.reset()
    prompts, params = _batch(vllm_module, "after")
    llm.generate(prompts, params, use_tqdm=False)
    assert len(request_spans(otel)) == 5
    assert sum(p.count for p in otel.metric_points("gen_ai.server.request.duration")) == 5


def test_broken_instrument_async(
    otel: OTelHarness,
    async_engine: Any,
    vllm_module: Any,
    aloop: asyncio.AbstractEventLoop,
    fresh_log: Any,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.setattr(fresh_log, "duration", _FaultyInstrument("duration"))  # FAULT INJECTION

    async def collect(rid: str, i: int) -> list[int]:
        params = vllm_module.SamplingParams(max_tokens=6, temperature=1.0, seed=200 + i)
        tokens: list[int] = []
        async for out in async_engine.generate(f"async fault {i}", params, rid):
            tokens = list(out.outputs[0].token_ids)
        return tokens

    async def run(tag: str) -> list[list[int]]:
        return await asyncio.gather(*(collect(f"{tag}-{i}", i) for i in range(5)))

    with suppress_instrumentation():
        reference = aloop.run_until_complete(run("ref"))
    with caplog.at_level(logging.WARNING):
        assert aloop.run_until_complete(run("b1")) == reference
        assert aloop.run_until_complete(run("b2")) == reference
        flush_emitters()
    assert len(_failures(caplog)) == 1
    assert len(request_spans(otel)) == 10  # spans are still made; only the histogram broke
    assert active_delta(otel) == 0
    assert all(v == 0 for v in in_flight(fresh_log).values())


@pytest.mark.parametrize("mode", ["end", "start"])
def test_broken_span_processor_offline(
    mode: str,
    otel: OTelHarness,
    llm: Any,
    vllm_module: Any,
    faulty_processor: _FaultySpanProcessor,
    fresh_log: Any,
    caplog: pytest.LogCaptureFixture,
) -> None:
    faulty_processor.mode = mode  # FAULT INJECTION
    counts = []
    try:
        with caplog.at_level(logging.WARNING):
            for tag in ("first", "second"):
                prompts, params = _batch(vllm_module, tag)
                with suppress_instrumentation():
                    reference = llm.generate(prompts, params, use_tqdm=False)
                outputs = llm.generate(prompts, params, use_tqdm=False)
                flush_emitters()
                assert _tokens(outputs) == _tokens(reference)
                counts.append(len(_failures(caplog)))
    finally:
        faulty_processor.mode = None
    # Logged once per failing site (the batch span, the request spans), never per request/batch.
    assert 1 <= counts[0] <= 2 and counts[1] == counts[0], counts
    assert active_delta(otel) == 0
    assert all(v == 0 for v in in_flight(fresh_log).values())


@pytest.mark.parametrize("mode", ["start", "end"])
def test_broken_span_processor_async(
    mode: str,
    otel: OTelHarness,
    async_engine: Any,
    vllm_module: Any,
    aloop: asyncio.AbstractEventLoop,
    faulty_processor: _FaultySpanProcessor,
    fresh_log: Any,
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def collect(rid: str) -> list[int]:
        params = vllm_module.SamplingParams(max_tokens=5, temperature=1.0, seed=7)
        tokens: list[int] = []
        async for out in async_engine.generate("span processor fault", params, rid):
            tokens = list(out.outputs[0].token_ids)
        return tokens

    with suppress_instrumentation():
        reference = aloop.run_until_complete(collect(f"sp-{mode}-ref"))
    faulty_processor.mode = mode  # FAULT INJECTION
    try:
        with caplog.at_level(logging.WARNING):
            for i in range(4):
                assert aloop.run_until_complete(collect(f"sp-{mode}-{i}")) == reference
            flush_emitters()
    finally:
        faulty_processor.mode = None
    assert len(_failures(caplog)) == 1
    assert active_delta(otel) == 0
    assert all(v == 0 for v in in_flight(fresh_log).values())
    # And afterwards everything is back to normal.
    otel.reset()
    aloop.run_until_complete(collect(f"sp-{mode}-after"))
    assert [s.attributes["gen_ai.response.id"] for s in request_spans(otel)] == [f"sp-{mode}-after"]


def test_a_renamed_engine_field_in_the_step_loop_costs_timing_not_the_generate(
    llm: Any,
    vllm_module: Any,
    otel: OTelHarness,
    fresh_log: Any,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """FAULT INJECTION: our read of ``EngineCoreOutput`` inside vLLM's step loop meets a renamed
    field (as a future vLLM could rename it): generate is unchanged, one warning, and the spans
    fall back from engine-step timing to what was observed at the call's boundary."""
    from otel_rollout.vllm import adapter

    prompts, params = _batch(vllm_module, "renamed")
    with suppress_instrumentation():
        reference = llm.generate(prompts, params, use_tqdm=False)

    def renamed(out: Any) -> tuple[str, bool, bool]:
        return out.request_id, bool(out.new_token_ids_renamed), out.finish_reason is not None

    monkeypatch.setattr(adapter, "_core_output_fields", renamed)
    with caplog.at_level(logging.WARNING):
        got = llm.generate(prompts, params, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in got] == [o.outputs[0].token_ids for o in reference]
    warnings = [r for r in _failures(caplog) if "process_outputs" in r.getMessage()]
    assert len(warnings) == 1
    spans = request_spans(otel)
    assert len(spans) == len(prompts)
    assert {s.attributes["rollout.timing.source"] for s in spans} == {"observed"}
