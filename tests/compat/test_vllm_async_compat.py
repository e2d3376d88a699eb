"""AsyncLLM.generate on whichever real vLLM this environment holds, stats on and off.

Stats on is ``AsyncEngineArgs``' default; stats off is what verl's server runs. Run this file in
a process of its own (scripts/test does): an AsyncLLM next to an in-process LLM can hang at
teardown (see testkit.engines.shutdown_async_llm).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import pytest

from testkit.engines import VLLM_KWARGS, shutdown_async_llm
from testkit.vllm_matrix import MS, assert_engine_stamps, row, wall_offset_ns
from tests.conftest import OTelHarness

pytestmark = pytest.mark.vllm


@pytest.fixture(scope="module")
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


@pytest.fixture(scope="module", params=["async_stats", "async"])
def engine(
    request: pytest.FixtureRequest,
    vllm_module: Any,
    tiny_model: str,
    instrumented: Any,
    loop: asyncio.AbstractEventLoop,
) -> Iterator[tuple[str, Any]]:
    """(config, AsyncLLM): one engine per configuration, shut down before the next starts."""
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.v1.engine.async_llm import AsyncLLM

    config = request.param
    args = AsyncEngineArgs(model=tiny_model, disable_log_stats=config == "async", **VLLM_KWARGS)

    async def start() -> Any:
        return AsyncLLM.from_engine_args(args)

    engine = loop.run_until_complete(start())
    yield config, engine
    shutdown_async_llm(engine)


def _stream(
    otel: OTelHarness,
    engine: Any,
    vllm_module: Any,
    loop: asyncio.AbstractEventLoop,
) -> tuple[dict[str, Any], dict[str, Any], dict[str, tuple[int, int]]]:
    """Two concurrent streams, 8 and 96 tokens: (last output, span) per request id.

    ``bounds`` (third): per request id, when its stream was opened and when the caller held its
    last chunk (wall clock ns), the interval any engine-side time must lie within.
    """

    async def one(rid: str, n: int) -> Any:
        last = None
        params = vllm_module.SamplingParams(max_tokens=n, ignore_eos=True)
        sent_ns = time.time_ns()
        async for out in engine.generate(f"prompt {rid}", params, rid):
            last = out
        bounds[rid] = (sent_ns, time.time_ns())
        return last

    async def both() -> list[Any]:
        return await asyncio.gather(one("short", 8), one("long", 96))

    bounds: dict[str, tuple[int, int]] = {}
    outputs = {o.request_id: o for o in loop.run_until_complete(both())}
    spans = {
        s.attributes["gen_ai.response.id"]: s
        for s in otel.finished_spans()
        if s.attributes.get("gen_ai.provider.name") == "vllm"
    }
    return outputs, spans, bounds


def _xfail_gap(request: pytest.FixtureRequest, vllm_module: Any, config: str) -> None:
    reason = row(vllm_module.__version__)[1].get(config)
    if reason:
        request.applymarker(pytest.mark.xfail(strict=True, reason=reason))


def test_counts_and_source(
    otel: OTelHarness, engine: tuple[str, Any], vllm_module: Any, loop: asyncio.AbstractEventLoop
) -> None:
    config, llm = engine
    outputs, spans, _ = _stream(otel, llm, vllm_module, loop)
    assert set(spans) == {"short", "long"}
    for rid, n in (("short", 8), ("long", 96)):
        assert len(outputs[rid].outputs[0].token_ids) == n
        assert spans[rid].attributes["gen_ai.usage.output_tokens"] == n
    expected = row(vllm_module.__version__)[0][config]
    assert {s.attributes["rollout.timing.source"] for s in spans.values()} == {expected}
    assert sum(p.count for p in otel.metric_points("gen_ai.server.request.duration")) == 2


def test_span_times_are_the_engines_own(
    request: pytest.FixtureRequest,
    otel: OTelHarness,
    engine: tuple[str, Any],
    vllm_module: Any,
    loop: asyncio.AbstractEventLoop,
) -> None:
    """Engine timing (stats on: RequestStateStats within 1 ms; off: engine step stamps).

    Engine step stamps are taken in the engine core when the step ends, before its outputs
    travel to the caller: every span time lies between the caller's call and its last chunk,
    and the first token is stamped no later than the finish.
    """
    config, llm = engine
    _xfail_gap(request, vllm_module, config)
    outputs, spans, bounds = _stream(otel, llm, vllm_module, loop)
    for rid, output in outputs.items():
        span = spans[rid]
        assert span.attributes["rollout.timing.source"] in ("engine", "engine_steps")
        (event,) = [e for e in span.events if e.name == "gen_ai.first_token"]
        sent_ns, seen_ns = bounds[rid]
        # MS: the span's clock converts monotonic stamps to wall time once, the test reads wall time
        assert sent_ns - MS <= span.start_time <= event.timestamp <= span.end_time <= seen_ns + MS
        if output.metrics is not None:
            assert_engine_stamps(span, output.metrics, wall_offset_ns())
    assert spans["short"].end_time < spans["long"].end_time
