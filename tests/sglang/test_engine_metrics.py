"""``Engine(enable_metrics=True)``: spans carry SGLang's own timeline, to the nanosecond."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.conftest import OTelHarness
from tests.sglang.conftest import start_engine
from tests.sglang.helpers import assert_matches, in_flight, params, spans_by_id

pytestmark = pytest.mark.sglang


@pytest.fixture(scope="module")
def engine_metrics(sglang_module: Any, tiny_model: str, instrumented: Any) -> Iterator[Any]:
    eng = start_engine(sglang_module, tiny_model, enable_metrics=True)
    yield eng
    eng.shutdown()


def _assert_engine_timeline(span: Any, meta: dict[str, Any]) -> None:
    """Start, end, first token and queue time are SGLang's stamps, converted once."""
    start = int(meta["request_received_ts"] * 1e9)
    assert span.attributes["rollout.timing.source"] == "engine"
    assert span.start_time == start
    assert span.end_time == start + int(meta["e2e_latency"] * 1e9)
    (event,) = [e for e in span.events if e.name == "gen_ai.first_token"]
    assert event.timestamp == start + int(meta["first_token_latency"] * 1e9)
    assert span.attributes["rollout.request.time_to_first_token"] == pytest.approx(
        meta["first_token_latency"], abs=1e-8
    )
    queue = meta["forward_entry_time"] - meta["request_received_ts"]
    assert span.attributes["rollout.request.queue_time"] == pytest.approx(max(0.0, queue), abs=1e-6)


def test_engine_timeline_batch_and_stream(otel: OTelHarness, engine_metrics: Any) -> None:
    lengths = [3, 12, 6]
    outs = engine_metrics.generate(
        prompt=[f"q{i}" for i in range(3)], sampling_params=[params(n) for n in lengths]
    )

    async def stream() -> tuple[int, dict[str, Any]]:
        gen = await engine_metrics.async_generate(
            prompt="s =", stream=True, sampling_params=params(5)
        )
        count, last = 0, {}
        async for chunk in gen:
            count, last = len(chunk["output_ids"]), chunk
        return count, last

    streamed, last = engine_metrics.loop.run_until_complete(stream())

    by_id = spans_by_id(otel)
    assert len(by_id) == 4
    for out, n in zip(outs, lengths, strict=False):
        span = by_id[out["meta_info"]["id"]]
        assert_matches(span, out, n)
        _assert_engine_timeline(span, out["meta_info"])
    span = by_id[last["meta_info"]["id"]]
    assert_matches(span, last, streamed)
    _assert_engine_timeline(span, last["meta_info"])

    for name in (
        "rollout.request.queue_time",
        "gen_ai.server.time_to_first_token",
        "gen_ai.server.request.duration",
    ):
        assert sum(p.count for p in otel.metric_points(name)) == 4, name
    tpot = otel.metric_points("gen_ai.server.time_per_output_token")
    assert sum(p.count for p in tpot) == 4
    assert in_flight(otel) == 0
