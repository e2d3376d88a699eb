"""1,000 concurrent streamed requests on one real AsyncLLM: one span each, no cross-talk."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from otel_rollout.vllm.adapter import AsyncRequest
from testkit.engines import vllm_telemetry
from tests.conftest import OTelHarness
from tests.reliability.helpers import active_delta, in_flight, live, request_spans

pytestmark = pytest.mark.vllm

N = 1000


def test_thousand_concurrent_requests(
    otel: OTelHarness, async_engine: Any, vllm_module: Any, aloop: asyncio.AbstractEventLoop
) -> None:
    want = {f"c-{i}": 1 + (i * 7) % 4 for i in range(N)}  # 1..4 tokens, interleaved

    async def one(rid: str, n: int) -> tuple[str, int]:
        params = vllm_module.SamplingParams(max_tokens=n, ignore_eos=True)
        tokens = 0
        async for out in async_engine.generate(f"request {rid}", params, rid):
            tokens = len(out.outputs[0].token_ids)
        return rid, tokens

    async def run() -> list[tuple[str, int]]:
        return await asyncio.gather(*(one(rid, n) for rid, n in want.items()))

    start = time.monotonic()
    results = aloop.run_until_complete(run())
    elapsed = time.monotonic() - start
    print(f"\n{N} concurrent requests in {elapsed:.1f} s")
    assert dict(results) == want  # the engine's own answer

    spans = request_spans(otel)
    assert len(spans) == N
    by_id = {s.attributes["gen_ai.response.id"]: s for s in spans}
    assert set(by_id) == set(want)  # one span per request, none merged or duplicated
    for rid, n in want.items():  # no cross-talk: each span counts its own request's tokens
        span = by_id[rid]
        assert span.attributes["gen_ai.usage.output_tokens"] == n, rid
        assert span.attributes["gen_ai.request.max_tokens"] == n, rid
        assert span.attributes["gen_ai.response.finish_reasons"] == ("length",), rid
    assert len({s.context.span_id for s in spans}) == N

    durations = otel.metric_points("gen_ai.server.request.duration")
    assert sum(p.count for p in durations) == N
    output = [
        p
        for p in otel.metric_points("gen_ai.client.token.usage")
        if p.attributes["gen_ai.token.type"] == "output"
    ]
    assert sum(p.count for p in output) == N
    assert sum(p.sum for p in output) == sum(want.values())
    assert active_delta(otel) == 0
    assert all(v == 0 for v in in_flight(vllm_telemetry()).values())
    assert live(AsyncRequest) == 0
    assert elapsed < 60
