"""Engine errors reach the caller unmodified; the span records them; in-flight is given back.

Each error is produced by the real engine. The reference is the same call with instrumentation
suppressed: the instrumented call must raise the same type with the same args, and its traceback
must end at the same raise site inside vLLM (our wrappers add frames above it, never replace it).
"""

from __future__ import annotations

import asyncio
import traceback
from collections.abc import Callable
from typing import Any

import pytest
from opentelemetry.instrumentation.utils import suppress_instrumentation
from opentelemetry.trace import StatusCode

from otel_rollout.vllm.adapter import AsyncRequest, StepTimes
from testkit.engines import vllm_telemetry
from tests.conftest import OTelHarness
from tests.reliability.helpers import (
    active_delta,
    batch_spans,
    in_flight,
    live,
    request_spans,
    spin,
)

pytestmark = pytest.mark.vllm


def _raise_site(exc: BaseException) -> tuple[str, int, str]:
    last = traceback.extract_tb(exc.__traceback__)[-1]
    return last.filename, last.lineno, last.name


def _capture(call: Callable[[], Any]) -> BaseException:
    try:
        call()
    except Exception as exc:  # the engine's own error
        return exc
    raise AssertionError("the engine accepted the call")


def _assert_same_error(reference: BaseException, error: BaseException) -> None:
    assert type(error) is type(reference)
    assert error.args == reference.args
    site = _raise_site(error)
    assert site == _raise_site(reference)
    assert "/vllm/" in site[0] and "otel_rollout" not in site[0]
    assert error.__cause__ is reference.__cause__ or type(error.__cause__) is type(
        reference.__cause__
    )


OFFLINE_ERRORS: dict[str, Callable[[Any, Any], Any]] = {
    "params-length-mismatch": lambda llm, v: llm.generate(
        ["a", "b"], [v.SamplingParams(max_tokens=2)] * 3, use_tqdm=False
    ),
    "prompt-too-long": lambda llm, v: llm.generate(
        ["x " * 5000], v.SamplingParams(max_tokens=2), use_tqdm=False
    ),
    "bad-sampling-params": lambda llm, v: llm.generate(
        ["a"], v.SamplingParams(max_tokens=2, allowed_token_ids=[10**7]), use_tqdm=False
    ),
    "chat-bad-logit-bias": lambda llm, v: llm.chat(
        [{"role": "user", "content": "hi"}],
        v.SamplingParams(max_tokens=2, logit_bias={10**7: 1.0}),
        use_tqdm=False,
    ),
}


@pytest.mark.parametrize("case", list(OFFLINE_ERRORS))
def test_offline_error_reaches_caller_unmodified(
    case: str, otel: OTelHarness, llm: Any, vllm_module: Any
) -> None:
    call = OFFLINE_ERRORS[case]
    with suppress_instrumentation():
        reference = _capture(lambda: call(llm, vllm_module))
    assert request_spans(otel) == [] and batch_spans(otel) == []  # suppressed means suppressed

    error = _capture(lambda: call(llm, vllm_module))
    _assert_same_error(reference, error)

    (span,) = request_spans(otel)
    assert span.status.status_code == StatusCode.ERROR
    assert span.attributes["error.type"] == type(error).__qualname__
    assert type(error).__qualname__ in span.status.description
    (batch,) = batch_spans(otel)
    assert batch.status.status_code == StatusCode.ERROR
    assert batch.attributes["error.type"] == type(error).__qualname__
    assert span.parent.span_id == batch.context.span_id
    (point,) = otel.metric_points("gen_ai.server.request.duration")
    assert point.attributes["rollout.finish_reason"] == "error"
    assert point.attributes["error.type"] == type(error).__qualname__
    assert active_delta(otel) == 0
    assert all(v == 0 for v in in_flight(vllm_telemetry()).values())
    # A raised exception keeps its frames (and their locals) alive through its traceback;
    # once the caller lets go of it, nothing of the call may remain.
    del error
    assert live(StepTimes) == 0


async def _drain(engine: Any, prompt: str, params: Any, rid: str) -> BaseException:
    try:
        async for _ in engine.generate(prompt, params, rid):
            pass
    except Exception as exc:
        return exc
    raise AssertionError("the engine accepted the request")


ASYNC_ERRORS: dict[str, Callable[[Any], tuple[str, Any]]] = {
    "prompt-too-long": lambda v: ("x " * 5000, v.SamplingParams(max_tokens=4)),
    "bad-sampling-params": lambda v: (
        "a",
        v.SamplingParams(max_tokens=4, allowed_token_ids=[10**7]),
    ),
}


def _check_async_error(
    otel: OTelHarness,
    engine: Any,
    vllm_module: Any,
    loop: asyncio.AbstractEventLoop,
    prompt: str,
    params: Any,
    rid: str,
) -> str:
    with suppress_instrumentation():
        stream = engine.generate(prompt, params, rid + "-ref")  # the wrapper sees suppression here
    reference = loop.run_until_complete(_consume_stream(stream))
    assert request_spans(otel) == []

    error = loop.run_until_complete(_drain(engine, prompt, params, rid))
    _assert_same_error(reference, error)
    (span,) = request_spans(otel)
    assert span.attributes["gen_ai.response.id"] == rid
    assert span.status.status_code == StatusCode.ERROR
    assert span.attributes["error.type"] == type(error).__qualname__
    assert active_delta(otel) == 0
    assert all(v == 0 for v in in_flight(vllm_telemetry()).values())
    name = type(error).__module__
    del error  # its traceback holds the stream's frames until the caller lets go
    spin(loop)  # the engine's own cleanup of the failed generator runs on the loop
    assert live(AsyncRequest, StepTimes) == 0
    return name


async def _consume_stream(stream: Any) -> BaseException:
    try:
        async for _ in stream:
            pass
    except Exception as exc:
        return exc
    raise AssertionError("the engine accepted the request")


@pytest.mark.parametrize("case", list(ASYNC_ERRORS))
def test_async_error_reaches_caller_unmodified(
    case: str,
    otel: OTelHarness,
    async_engine: Any,
    vllm_module: Any,
    aloop: asyncio.AbstractEventLoop,
) -> None:
    prompt, params = ASYNC_ERRORS[case](vllm_module)
    _check_async_error(otel, async_engine, vllm_module, aloop, prompt, params, f"err-{case}")


@pytest.mark.shuts_down_engine
def test_generate_on_shut_down_engine(
    otel: OTelHarness, async_engine: Any, vllm_module: Any, aloop: asyncio.AbstractEventLoop
) -> None:
    """Runs last (see conftest): it stops the session's AsyncLLM."""
    async_engine.shutdown()
    params = vllm_module.SamplingParams(max_tokens=4)
    module = _check_async_error(
        otel, async_engine, vllm_module, aloop, "after shutdown", params, "err-shutdown"
    )
    assert "otel_rollout" not in module
