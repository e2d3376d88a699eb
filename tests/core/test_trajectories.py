"""Agentic trajectories (``rollout_trajectory``): one span per sample over its turns, tool calls
and scoring, its figures equal to an independent record kept here; engine-free (records handed
over through a real ``Telemetry``, as the engine adapters do). The real-engine counterpart is
``tests/vllm/test_trajectories_vllm.py``."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import pytest

from otel_rollout import rollout_step
from otel_rollout.semconv import (
    STEP_SPAN_NAME,
    TRAJECTORY_DURATION,
    TRAJECTORY_STATUS,
    TRAJECTORY_TURNS,
)
from otel_rollout.telemetry import Telemetry
from otel_rollout.trajectories import (
    rollout_scoring,
    rollout_tool,
    rollout_trajectory,
    union_seconds,
)
from testkit.records import make_record
from tests.conftest import OTelHarness

MS = 1_000_000


def _turn(telemetry: Telemetry, seconds: float, tokens: int) -> tuple[int, int]:
    """An engine request of ``seconds`` that finishes now, handed over as adapters do."""
    time.sleep(seconds)
    finish = time.time_ns()
    arrival = finish - int(seconds * 1e9)
    telemetry.emit(
        make_record(
            "m",
            arrival_ns=arrival,
            scheduled_ns=arrival,
            first_token_ns=arrival + 1,
            finish_ns=finish,
            output_tokens=tokens,
        )
    )
    return arrival, finish


def test_union_of_intervals() -> None:
    assert union_seconds([]) == 0
    assert union_seconds([(0, 2 * 10**9), (10**9, 3 * 10**9), (5 * 10**9, 6 * 10**9)]) == 4.0


def test_a_trajectory_is_its_turns_tools_and_scoring(
    otel: OTelHarness, make_telemetry: Callable[..., Telemetry]
) -> None:
    telemetry = make_telemetry()
    with rollout_step(3):
        with rollout_trajectory("coder", sample_id=17, group_id=4) as traj:
            _turn(telemetry, 0.03, 12)
            with rollout_tool("python", call_id="c1"):
                time.sleep(0.04)
            _turn(telemetry, 0.02, 5)
            with rollout_scoring():
                time.sleep(0.01)
            traj.set_reward(0.5, advantage=-0.25)
        with rollout_trajectory("coder", sample_id=18) as other:
            _turn(telemetry, 0.01, 3)
            other.set_status("truncated")
    spans = otel.finished_spans()
    step = next(s for s in spans if s.name == STEP_SPAN_NAME)
    first, second = sorted(
        (s for s in spans if s.name == "invoke_agent coder"),
        key=lambda s: s.attributes["rollout.trajectory.sample_id"],
    )
    assert first.parent.span_id == step.context.span_id
    a = first.attributes
    assert a["gen_ai.operation.name"] == "invoke_agent"
    assert a["rollout.step"] == 3
    assert a["rollout.trajectory.group_id"] == "4"
    assert (a["rollout.trajectory.turns"], a["rollout.trajectory.output_tokens"]) == (2, 17)
    assert a["rollout.trajectory.tool_calls"] == 1
    assert a["rollout.trajectory.generation_s"] == pytest.approx(0.05, abs=0.002)
    assert a["rollout.trajectory.tool_s"] >= 0.04
    assert a["rollout.trajectory.scoring_s"] >= 0.01
    duration = (first.end_time - first.start_time) / 1e9
    busy = sum(a[f"rollout.trajectory.{k}_s"] for k in ("generation", "tool", "scoring"))
    assert a["rollout.trajectory.waiting_s"] == pytest.approx(duration - busy, abs=0.002)
    assert (a["rollout.trajectory.reward"], a["rollout.trajectory.advantage"]) == (0.5, -0.25)
    assert a[TRAJECTORY_STATUS] == "completed"
    assert second.attributes[TRAJECTORY_STATUS] == "truncated"
    assert second.attributes["rollout.trajectory.turns"] == 1
    # turns, tool call and scoring are the trajectory's children
    children = {s.name for s in spans if s.parent and s.parent.span_id == first.context.span_id}
    assert {"execute_tool python", "rollout.scoring"} <= children
    tool = next(s for s in spans if s.name == "execute_tool python")
    assert tool.attributes["gen_ai.tool.name"] == "python"
    assert tool.attributes["gen_ai.tool.call.id"] == "c1"
    requests = [s for s in spans if s.attributes.get("gen_ai.usage.output_tokens") is not None]
    assert sum(1 for r in requests if r.parent.span_id == first.context.span_id) == 2
    # the step still counts every request
    assert step.attributes["rollout.step.requests"] == 3
    # one point per trajectory, by status, exemplars on the trajectory span
    points = {p.attributes[TRAJECTORY_STATUS]: p for p in otel.metric_points(TRAJECTORY_DURATION)}
    assert points["completed"].count == 1 and points["truncated"].count == 1
    assert points["completed"].sum == pytest.approx(traj.duration_s, abs=1e-6)
    (exemplar,) = [e for e in points["completed"].exemplars]
    assert exemplar.span_id == first.context.span_id
    turns = {p.attributes[TRAJECTORY_STATUS]: p.sum for p in otel.metric_points(TRAJECTORY_TURNS)}
    assert turns == {"completed": 2, "truncated": 1}


def test_a_failing_body_is_an_error_trajectory_and_the_exception_passes(
    otel: OTelHarness,
) -> None:
    class Boom(Exception):
        pass

    with pytest.raises(Boom):
        with rollout_trajectory(), rollout_tool("search"):
            raise Boom("tool failed")
    spans = {s.name: s for s in otel.finished_spans()}
    assert spans["invoke_agent rollout"].attributes[TRAJECTORY_STATUS] == "error"
    assert spans["invoke_agent rollout"].attributes["error.type"].endswith("Boom")
    assert spans["execute_tool search"].status.status_code.name == "ERROR"


def test_async_and_decorator_forms(otel: OTelHarness) -> None:
    @rollout_trajectory("agent")
    async def sample(i: int) -> int:
        async with rollout_tool("sleep"):
            await asyncio.sleep(0.01 * i)
        return i

    async def main() -> list[int]:
        return list(await asyncio.gather(*(sample(i) for i in (1, 2, 3))))

    assert asyncio.run(main()) == [1, 2, 3]
    trajectories = [s for s in otel.finished_spans() if s.name == "invoke_agent agent"]
    assert len(trajectories) == 3
    assert sorted(round(s.attributes["rollout.trajectory.tool_s"], 2) for s in trajectories) == [
        0.01,
        0.02,
        0.03,
    ]


def test_an_unknown_status_is_bounded_on_the_metric(otel: OTelHarness) -> None:
    with rollout_trajectory() as t:
        t.set_status("made-up-by-the-loop")
    (span,) = [s for s in otel.finished_spans() if s.name.startswith("invoke_agent")]
    assert span.attributes[TRAJECTORY_STATUS] == "made-up-by-the-loop"
    labels = {p.attributes[TRAJECTORY_STATUS] for p in otel.metric_points(TRAJECTORY_DURATION)}
    assert labels == {"other"}
