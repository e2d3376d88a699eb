"""instrument / uninstrument in every order: originals restored exactly, never double spans.

The session keeps vLLM instrumented (fixture ``instrumented``); each test here restores that
state at the end, whatever happens.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest

from otel_rollout import VLLMInstrumentor
from tests.conftest import OTelHarness
from tests.reliability.helpers import batch_spans, request_spans

pytestmark = pytest.mark.vllm


def _targets() -> dict[str, tuple[Any, str]]:
    """Every (owner, attribute) the instrumentor patches, from its own targets list: a target
    added later is covered here without editing this test."""
    import importlib

    from otel_rollout.vllm import VLLMInstrumentor

    found: dict[str, tuple[Any, str]] = {}
    for target in VLLMInstrumentor()._targets():
        owner, _, attr = target.name.rpartition(".")
        module = importlib.import_module(target.module)
        found[target.name] = (getattr(module, owner) if owner else module, attr)
    assert {"LLM.generate", "AsyncLLM.generate", "OutputProcessor.process_outputs"} <= set(found)
    return found


def _current() -> dict[str, Any]:
    return {name: owner.__dict__[attr] for name, (owner, attr) in _targets().items()}


def _is_wrapped(obj: Any) -> bool:
    return hasattr(obj, "__wrapped__") and hasattr(obj, "_self_wrapper")


@pytest.fixture
def instrumentor(instrumented: Any) -> Iterator[VLLMInstrumentor]:
    inst = VLLMInstrumentor()
    assert inst is instrumented  # BaseInstrumentor is a singleton
    try:
        yield inst
    finally:
        if not inst.is_instrumented_by_opentelemetry:
            inst.instrument()
        assert all(_is_wrapped(f) for f in _current().values())


def _generate(llm: Any, vllm_module: Any, n: int = 3) -> None:
    llm.generate(
        [f"life {i}" for i in range(n)],
        vllm_module.SamplingParams(max_tokens=2, ignore_eos=True),
        use_tqdm=False,
    )


def test_instrument_uninstrument_orders(
    instrumentor: VLLMInstrumentor, otel: OTelHarness, llm: Any, vllm_module: Any
) -> None:
    wrapped = _current()
    originals = {name: f.__wrapped__ for name, f in wrapped.items()}
    assert all(_is_wrapped(f) for f in wrapped.values())

    instrumentor.uninstrument()
    assert _current() == originals and all(_current()[k] is originals[k] for k in originals)
    instrumentor.uninstrument()  # twice: no-op
    assert all(_current()[k] is originals[k] for k in originals)
    _generate(llm, vllm_module)
    assert request_spans(otel) == [] and batch_spans(otel) == []

    instrumentor.instrument()
    instrumentor.instrument()  # twice: no-op, no second layer
    for name, f in _current().items():
        assert _is_wrapped(f) and f.__wrapped__ is originals[name], name
    otel.reset()
    _generate(llm, vllm_module)  # `llm` was created long before this instrument()
    assert len(request_spans(otel)) == 3 and len(batch_spans(otel)) == 1

    for _ in range(2):  # instrument → uninstrument → instrument
        instrumentor.uninstrument()
        assert all(_current()[k] is originals[k] for k in originals)
        instrumentor.instrument()
        for name, f in _current().items():
            assert f.__wrapped__ is originals[name], name  # never a wrapper of a wrapper
    otel.reset()
    _generate(llm, vllm_module)
    assert len(request_spans(otel)) == 3 and len(batch_spans(otel)) == 1
    assert sum(p.count for p in otel.metric_points("gen_ai.server.request.duration")) == 3


def test_uninstrument_without_instrument_touches_nothing(instrumentor: VLLMInstrumentor) -> None:
    """A never-instrumented instrumentor (bypassing the singleton) must not unwrap others' patches."""
    before = _current()
    stranger = object.__new__(VLLMInstrumentor)
    stranger._uninstrument()
    after = _current()
    assert all(after[k] is before[k] for k in before)


def test_existing_async_engine_covered_after_reinstrument(
    instrumentor: VLLMInstrumentor,
    otel: OTelHarness,
    async_engine: Any,
    vllm_module: Any,
    aloop: asyncio.AbstractEventLoop,
) -> None:
    params = vllm_module.SamplingParams(max_tokens=2, ignore_eos=True)

    async def run(rid: str) -> None:
        async for _ in async_engine.generate("life async", params, rid):
            pass

    instrumentor.uninstrument()
    aloop.run_until_complete(run("life-off"))
    assert request_spans(otel) == []
    instrumentor.instrument()
    aloop.run_until_complete(run("life-on"))
    assert [s.attributes["gen_ai.response.id"] for s in request_spans(otel)] == ["life-on"]
