"""Every way an AsyncLLM stream can end: span ends exactly once, in-flight restored, nothing kept.

Real engine throughout (AsyncLLM on CPU). Scenarios: a consumer that breaks out early, aclose(),
task cancellation, engine.abort() of an in-flight request, and a stream dropped without closing
and garbage-collected.
"""

from __future__ import annotations

import asyncio
import gc
from typing import Any

import pytest
from opentelemetry.trace import StatusCode

from otel_rollout.vllm.adapter import AsyncRequest, StepTimes
from testkit.engines import vllm_telemetry
from tests.conftest import OTelHarness
from tests.reliability.helpers import (
    active_delta,
    in_flight,
    live,
    request_spans,
    spin,
)

pytestmark = pytest.mark.vllm

LONG = 400  # tokens: far more than any scenario lets the stream produce


def _params(vllm_module: Any) -> Any:
    return vllm_module.SamplingParams(max_tokens=LONG, ignore_eos=True)


async def _early_break(engine: Any, params: Any) -> None:
    async for _ in engine.generate("break early", params, "s-break"):
        break  # the stream is left unclosed; its frame drops it


async def _aclose(engine: Any, params: Any) -> None:
    stream = engine.generate("close me", params, "s-aclose")
    await stream.__anext__()
    await stream.aclose()
    await stream.aclose()  # closing twice changes nothing


async def _cancel(engine: Any, params: Any) -> None:
    started = asyncio.Event()

    async def consume() -> None:
        async for _ in engine.generate("cancel me", params, "s-cancel"):
            started.set()

    task = asyncio.create_task(consume())
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def _abort(engine: Any, params: Any) -> None:
    outputs = []
    async for out in engine.generate("abort me", params, "s-abort"):
        outputs.append(out)
        if len(outputs) == 2:
            await engine.abort("s-abort")
    assert len(outputs[-1].outputs[0].token_ids) < LONG


async def _abandon(engine: Any, params: Any) -> None:
    stream = engine.generate("drop me", params, "s-abandon")
    await stream.__anext__()
    del stream  # never closed, never exhausted
    gc.collect()


SCENARIOS = {
    "s-break": (_early_break, "StreamClosedEarly"),
    "s-aclose": (_aclose, "StreamClosedEarly"),
    "s-cancel": (_cancel, "CancelledError"),
    "s-abort": (_abort, None),  # vLLM ends an aborted stream normally, finish_reason "abort"
    "s-abandon": (_abandon, "StreamClosedEarly"),
}


@pytest.mark.parametrize("rid", list(SCENARIOS))
def test_stream_end_finalizes_once(
    rid: str,
    otel: OTelHarness,
    async_engine: Any,
    vllm_module: Any,
    aloop: asyncio.AbstractEventLoop,
) -> None:
    scenario, error_type = SCENARIOS[rid]
    telemetry = vllm_telemetry()
    before = in_flight(telemetry)

    aloop.run_until_complete(scenario(async_engine, _params(vllm_module)))
    spin(aloop)
    gc.collect()
    spin(aloop)  # finalizers scheduled by the collection (async generator aclose) run here

    spans = request_spans(otel)
    assert [s.attributes["gen_ai.response.id"] for s in spans] == [rid]  # exactly once
    (span,) = spans
    assert span.end_time is not None and span.start_time <= span.end_time
    assert span.attributes["gen_ai.usage.output_tokens"] < LONG
    if error_type is None:
        assert span.status.status_code == StatusCode.UNSET
        assert span.attributes["gen_ai.response.finish_reasons"] == ("abort",)
    else:
        assert span.status.status_code == StatusCode.ERROR
        assert span.attributes["error.type"] == error_type
    (point,) = otel.metric_points("gen_ai.server.request.duration")
    assert point.count == 1 and point.attributes["rollout.finish_reason"] == "abort"

    # In flight back where it was, in the exported metric and in our internal map.
    assert active_delta(otel) == 0
    assert before == {m: 0 for m in before}  # nothing else in flight in this session now
    assert all(v == 0 for v in in_flight(telemetry).values())
    # Nothing of ours retained, and vLLM itself forgot the request (we did not keep it alive).
    assert live(AsyncRequest, StepTimes) == 0
    assert async_engine.output_processor.request_states == {}

    # No late second end: another collection and more loop time add no span.
    gc.collect()
    spin(aloop, 0.1)
    assert len(request_spans(otel)) == 1


def test_normal_streams_leave_nothing_behind(
    otel: OTelHarness, async_engine: Any, vllm_module: Any, aloop: asyncio.AbstractEventLoop
) -> None:
    params = vllm_module.SamplingParams(max_tokens=3, ignore_eos=True)

    async def one(i: int) -> int:
        tokens = 0
        async for out in async_engine.generate(f"ok {i}", params, f"ok-{i}"):
            tokens = len(out.outputs[0].token_ids)
        return tokens

    async def run() -> list[int]:
        return await asyncio.gather(*(one(i) for i in range(8)))

    assert aloop.run_until_complete(run()) == [3] * 8
    assert len(request_spans(otel)) == 8
    assert active_delta(otel) == 0
    assert all(v == 0 for v in in_flight(vllm_telemetry()).values())
    assert live(AsyncRequest) == 0


def test_offline_calls_leave_no_step_times(otel: OTelHarness, llm: Any, vllm_module: Any) -> None:
    params = vllm_module.SamplingParams(max_tokens=3, ignore_eos=True)
    llm.generate(["a", "b", "c"], params, use_tqdm=False)
    # The engine rejects it (its error class differs across vLLM releases; its message does not).
    with pytest.raises(Exception, match="maximum (model|context) length"):
        llm.generate(["x " * 5000], params, use_tqdm=False)
    assert len(request_spans(otel)) == 4
    assert live(StepTimes) == 0
    assert active_delta(otel) == 0
    assert all(v == 0 for v in in_flight(vllm_telemetry()).values())
