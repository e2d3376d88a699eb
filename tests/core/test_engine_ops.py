"""Engine operations without an engine: the held-time accounting and the wrapper's contract.

The real engines' calls are tested in ``tests/vllm/test_engine_ops.py`` and
``tests/sglang/test_engine_ops.py``; here, what does not need one: time is split exactly into
busy, idle and held; a nested call counts once; a generic RPC that is not a weight update runs
unobserved; a failure of ours leaves the call unobserved but run; coroutines are timed when
awaited.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

import pytest

from otel_rollout import engine_ops as ops
from otel_rollout import rollout_step
from otel_rollout.activity import EngineActivity
from otel_rollout.telemetry import Telemetry
from tests.conftest import OTelHarness


def _phase_spans(otel: OTelHarness) -> list[Any]:
    return [s for s in otel.finished_spans() if s.name.startswith("rollout.phase ")]


def test_time_splits_exactly_into_busy_idle_and_held() -> None:
    activity = EngineActivity()
    start = time.monotonic()
    time.sleep(0.02)  # idle
    activity.change(1)
    time.sleep(0.02)  # busy
    activity.hold(1)
    time.sleep(0.03)  # held, although a request is in flight: it waits on the operation
    activity.hold(-1)
    activity.set_state("paused", True)
    time.sleep(0.03)  # held: paused
    activity.set_state("paused", False)
    time.sleep(0.02)  # busy again
    activity.change(-1)
    busy, idle, held = activity.totals()
    elapsed = time.monotonic() - start
    assert busy + idle + held == pytest.approx(elapsed, abs=0.01)
    assert 0.06 <= held < 0.06 + 0.02
    assert 0.04 <= busy < 0.04 + 0.02
    assert 0.02 <= idle


def test_held_time_is_reported_per_engine(otel: OTelHarness, make_telemetry: Any) -> None:
    telemetry: Telemetry = make_telemetry()
    activity = telemetry.engine_activity("held-model")
    activity.hold(1)
    time.sleep(0.02)
    activity.hold(-1)
    (point,) = [
        p
        for p in otel.metric_points("rollout.engine.held_time")
        if p.attributes["gen_ai.request.model"] == "held-model"
    ]
    assert point.value >= 0.02
    assert point.attributes == {
        "gen_ai.provider.name": "vllm",
        "gen_ai.request.model": "held-model",
    }


class Engine:
    """An object with engine-shaped methods, for the wrapper's own contract (no engine needed)."""

    def __init__(self) -> None:
        self.rpcs: list[str] = []

    def collective_rpc(self, method: Any, *args: Any) -> list[Any]:
        self.rpcs.append(getattr(method, "__name__", method))
        if method == "update_weights_outer":  # a weight RPC reaching another one inside
            return self.collective_rpc("reload_weights")
        return [method]

    async def wake_up(self, tags: list[str] | None = None) -> bool:
        await asyncio.sleep(0.02)
        return tags is None


def _wrap(telemetry: Telemetry, op: Any, name: str, model_of: Callable[[Any], str]) -> Any:
    wrapper = ops.operation_wrapper(telemetry, op, name, model_of)
    return lambda engine, method, *args, **kwargs: wrapper(method, engine, args, kwargs)


def test_nested_weight_rpcs_count_once_and_other_rpcs_pass(
    otel: OTelHarness, make_telemetry: Any
) -> None:
    telemetry = make_telemetry()
    engine = Engine()
    call = _wrap(telemetry, ops.weight_rpc("LLM"), "LLM.collective_rpc", lambda e: "m")
    wrapped_rpc = engine.collective_rpc
    # The engine's own inner call goes through the same (patched) method, as vLLM's does.
    engine.collective_rpc = lambda method, *a: call(engine, wrapped_rpc, method, *a)  # type: ignore[method-assign]
    with rollout_step(1):
        assert engine.collective_rpc("update_weights_outer") == ["reload_weights"]
        assert engine.collective_rpc("get_model") == ["get_model"]
    (span,) = _phase_spans(otel)
    assert span.attributes["rollout.phase.name"] == "weight_sync"
    assert (
        span.attributes["rollout.phase.framework_name"] == "LLM.collective_rpc:update_weights_outer"
    )
    assert engine.rpcs == ["update_weights_outer", "reload_weights", "get_model"]


def test_coroutine_is_timed_when_awaited_and_sets_states(
    otel: OTelHarness, make_telemetry: Any
) -> None:
    telemetry = make_telemetry()
    engine = Engine()
    call = _wrap(telemetry, ops.ENGINE_WAKE, "AsyncLLM.wake_up", lambda e: "wake-model")
    activity = telemetry.engine_activity("wake-model")
    activity.set_state("asleep", True)

    async def run() -> tuple[bool, bool]:
        partial = call(engine, engine.wake_up, tags=["weights"])
        await asyncio.sleep(0.05)  # made, not yet awaited: not timed
        first = await partial
        assert "asleep" in activity.states  # vLLM said: not fully awake yet
        return first, await call(engine, engine.wake_up)

    assert asyncio.run(run()) == (False, True)
    assert not activity.states
    spans = _phase_spans(otel)
    assert len(spans) == 2
    for span in spans:
        assert 0.02 <= (span.end_time - span.start_time) / 1e9 < 0.045


def test_a_failure_of_ours_leaves_the_call_run_unobserved(
    otel: OTelHarness, make_telemetry: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """Fault injection: the model label cannot be read (a renamed engine field)."""
    telemetry = make_telemetry()
    engine = Engine()

    def broken(_: Any) -> str:
        raise AttributeError("model_config")

    call = _wrap(telemetry, ops.weight_rpc("LLM"), "LLM.collective_rpc", broken)
    with caplog.at_level(logging.WARNING, logger="otel_rollout"):
        assert call(engine, engine.collective_rpc, "reload_weights") == ["reload_weights"]
        assert call(engine, engine.collective_rpc, "reload_weights") == ["reload_weights"]
    assert not _phase_spans(otel)
    assert len([r for r in caplog.records if "engine operation" in r.getMessage()]) == 1
