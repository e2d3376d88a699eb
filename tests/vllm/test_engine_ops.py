"""Weight sync, sleep and wake-up on the real vLLM CPU engine (issue #13 item 1).

An RL loop's step, as a trainer runs it: generate → score → put the engine to sleep (the trainer
would train here) → wake it → reload the weights through vLLM's own worker RPC → generate again.
Each engine call is timed by the test itself (its own clock, around the call): the phase spans,
the step's phase totals, the phase metric and the engine's held time must agree with that
independent timeline. (vLLM's CPU platform refuses ``enable_sleep_mode``; ``sleep``/``wake_up``
still run vLLM's real engine-core path, without offloading memory.)
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from opentelemetry.trace import StatusCode

from otel_rollout import rollout_phase, rollout_step
from otel_rollout.vllm.adapter import model_name
from testkit.engines import vllm_telemetry
from tests.conftest import OTelHarness

pytestmark = pytest.mark.vllm


def _phases(otel: OTelHarness) -> dict[str, list[Any]]:
    out: dict[str, list[Any]] = {}
    for span in otel.finished_spans():
        if span.name.startswith("rollout.phase "):
            out.setdefault(span.attributes["rollout.phase.name"], []).append(span)
    return out


def _step(otel: OTelHarness) -> Any:
    (step,) = [s for s in otel.finished_spans() if s.name == "rollout.step"]
    return step


def _seconds(span: Any) -> float:
    return float(span.end_time - span.start_time) / 1e9


class Timeline:
    """The test's own record of when each engine call ran (wall clock, ns)."""

    def __init__(self) -> None:
        self.calls: dict[str, tuple[int, int]] = {}

    def run(self, name: str, call: Any) -> Any:
        start = time.time_ns()
        try:
            return call()
        finally:
            self.calls[name] = (start, time.time_ns())

    def holds(self, name: str, span: Any) -> None:
        start, end = self.calls[name]
        assert start <= span.start_time <= span.end_time <= end, (name, start, end, span)


def test_weight_sync_sleep_and_wake_are_phases_of_the_step(
    otel: OTelHarness, llm: Any, vllm_module: Any
) -> None:
    params = vllm_module.SamplingParams(max_tokens=8, ignore_eos=True)
    activity = vllm_telemetry().engine_activity(model_name(llm))
    held0 = activity.totals()[2]
    timeline = Timeline()
    with rollout_step(1):
        first = llm.generate(["a", "b"], params, use_tqdm=False)
        with rollout_phase("reward"):
            time.sleep(0.05)
        timeline.run("sleep", lambda: llm.sleep(level=1))
        asleep_from = time.monotonic()
        time.sleep(0.3)  # the trainer's update would run here, the engine asleep
        asleep_s = time.monotonic() - asleep_from
        woke = timeline.run("wake", llm.wake_up)
        reloaded = timeline.run("reload", lambda: llm.collective_rpc("reload_weights"))
        other = llm.collective_rpc(lambda worker: 7)  # not a weight RPC: unobserved
        second = llm.generate(["c"], params, use_tqdm=False)
    held1 = activity.totals()[2]

    # vLLM's own results, unchanged.
    assert woke is True and reloaded == [None] and other == [7]
    assert [len(o.outputs[0].token_ids) for o in first + second] == [8, 8, 8]

    phases = _phases(otel)
    assert set(phases) == {"reward", "engine_sleep", "engine_wake", "weight_sync"}
    step = _step(otel)
    for kind, call, method in (
        ("engine_sleep", "sleep", "LLM.sleep"),
        ("engine_wake", "wake", "LLM.wake_up"),
        ("weight_sync", "reload", "LLM.collective_rpc:reload_weights"),
    ):
        (span,) = phases[kind]
        timeline.holds(call, span)
        assert span.parent.span_id == step.context.span_id
        assert span.instrumentation_scope.name == "otel_rollout.vllm"
        assert span.attributes["rollout.phase.framework"] == "vllm"
        assert span.attributes["rollout.phase.framework_name"] == method
        assert span.attributes["gen_ai.provider.name"] == "vllm"
        assert span.status.status_code != StatusCode.ERROR
        total = step.attributes[f"rollout.step.phase.{kind}.duration_s"]
        assert total == pytest.approx(_seconds(span), abs=1e-3)

    points = {
        p.attributes["rollout.phase.name"]: p
        for p in otel.metric_points("rollout.step.phase.duration")
    }
    assert {k: p.count for k, p in points.items()} == {
        "reward": 1,
        "engine_sleep": 1,
        "engine_wake": 1,
        "weight_sync": 1,
    }
    # Held from the sleep call's start to the wake-up's end, and during the reload: never idle.
    held = held1 - held0
    window = (timeline.calls["wake"][1] - timeline.calls["sleep"][0]) / 1e9
    reload_s = (timeline.calls["reload"][1] - timeline.calls["reload"][0]) / 1e9
    assert asleep_s <= held <= window + reload_s + 0.05, (held, asleep_s, window, reload_s)
    assert activity.states == set() and activity.operations_running == 0


def test_engine_error_passes_through_and_marks_the_phase(otel: OTelHarness, llm: Any) -> None:
    activity = vllm_telemetry().engine_activity(model_name(llm))
    with rollout_step(2), pytest.raises(Exception) as caught:
        llm.collective_rpc("no_such_weights_method")
    (span,) = _phases(otel)["weight_sync"]
    assert span.status.status_code == StatusCode.ERROR
    assert type(caught.value).__name__ in span.status.description
    assert activity.operations_running == 0 and not activity.states


def test_async_pause_update_resume(
    otel: OTelHarness, engine: Any, vllm_module: Any, loop: asyncio.AbstractEventLoop
) -> None:
    """``AsyncLLM``: pause generation, reload weights, resume — the replica held throughout."""
    activity = vllm_telemetry().engine_activity(model_name(engine))
    params = vllm_module.SamplingParams(max_tokens=8, ignore_eos=True)
    calls: dict[str, tuple[int, int]] = {}

    async def timed(name: str, coro: Any) -> Any:
        start = time.time_ns()
        try:
            return await coro
        finally:
            calls[name] = (start, time.time_ns())

    async def run() -> tuple[int, Any, float]:
        tokens = 0
        async for out in engine.generate("x", params, "r1"):
            tokens = len(out.outputs[0].token_ids)
        await timed("pause", engine.pause_generation())
        paused_from = time.monotonic()
        result = await timed("reload", engine.collective_rpc("reload_weights"))
        await asyncio.sleep(0.2)
        await timed("resume", engine.resume_generation())
        paused_s = time.monotonic() - paused_from
        after = 0
        async for out in engine.generate("y", params, "r2"):
            after = len(out.outputs[0].token_ids)
        return tokens + after, result, paused_s

    held0 = activity.totals()[2]
    with rollout_step(3):
        tokens, result, paused_s = loop.run_until_complete(run())
    held = activity.totals()[2] - held0

    assert tokens == 16 and result == [None]
    phases = _phases(otel)
    step = _step(otel)
    for kind, call, method in (
        ("generation_pause", "pause", "AsyncLLM.pause_generation"),
        ("weight_sync", "reload", "AsyncLLM.collective_rpc:reload_weights"),
        ("generation_resume", "resume", "AsyncLLM.resume_generation"),
    ):
        (span,) = phases[kind]
        start, end = calls[call]
        assert start <= span.start_time <= span.end_time <= end
        assert span.parent.span_id == step.context.span_id
        assert span.attributes["rollout.phase.framework_name"] == method
    window = (calls["resume"][1] - calls["pause"][0]) / 1e9
    assert paused_s <= held <= window + 0.05, (held, paused_s, window)
    assert not activity.states


def test_fully_async_staleness_is_the_versions_the_test_assigned(
    otel: OTelHarness, engine: Any, vllm_module: Any, loop: asyncio.AbstractEventLoop
) -> None:
    """Fully-async: the next wave's generation overlaps the weight update of this one.

    Wave A starts and is generating when the weights are reloaded (one update: version + 1);
    wave B starts after. The test assigns each request the number of updates completed before it
    started; its span's ``rollout.weight.version`` and the step's staleness must say the same.
    """
    activity = vllm_telemetry().engine_activity(model_name(engine))
    long = vllm_module.SamplingParams(max_tokens=64, ignore_eos=True)
    short = vllm_module.SamplingParams(max_tokens=8, ignore_eos=True)
    assigned: dict[str, int] = {}
    updates = 0

    async def request(rid: str, params: Any, started: asyncio.Event) -> int:
        assigned[rid] = updates
        tokens = 0
        async for out in engine.generate(f"prompt {rid}", params, rid):
            started.set()
            tokens = len(out.outputs[0].token_ids)
        return tokens

    async def run() -> list[int]:
        nonlocal updates
        wave_a = [asyncio.Event() for _ in range(3)]
        tasks = [asyncio.ensure_future(request(f"a{i}", long, e)) for i, e in enumerate(wave_a)]
        for event in wave_a:
            await event.wait()  # every A request is generating
        await engine.collective_rpc("reload_weights")
        updates += 1
        tasks += [asyncio.ensure_future(request(f"b{i}", short, asyncio.Event())) for i in range(3)]
        return list(await asyncio.gather(*tasks))

    base = activity.weights.current if activity.weights.seen else 0
    assert isinstance(base, int)
    with rollout_step(5) as step:
        tokens = loop.run_until_complete(run())
    assert tokens == [64, 64, 64, 8, 8, 8]

    spans = {
        s.attributes["gen_ai.response.id"]: s
        for s in otel.finished_spans()
        if s.attributes.get("gen_ai.response.id") in assigned
    }
    assert {rid: s.attributes["rollout.weight.version"] for rid, s in spans.items()} == {
        rid: base + n for rid, n in assigned.items()
    }
    staleness = step.stats.staleness if step.stats else None
    assert staleness is not None
    assert (staleness.current, staleness.max, staleness.stale_requests) == (base + 1, 1, 3)
    assert staleness.mean == pytest.approx(0.5)
    step_span = _step(otel)
    assert step_span.attributes["rollout.step.weight_version"] == base + 1
    assert step_span.attributes["rollout.step.staleness.max"] == 1
