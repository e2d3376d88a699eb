"""Agentic trajectories (``rollout_trajectory``): one span per sample over its turns, tool calls
and scoring, its figures equal to an independent record kept here; engine-free (records handed
over through a real ``Telemetry``, as the engine adapters do). The real-engine counterpart is
``tests/vllm/test_trajectories_vllm.py``."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from matplotlib.axes import Axes
from matplotlib.collections import LineCollection
from matplotlib.figure import Figure

from otel_rollout import rollout_step
from otel_rollout.config import RolloutConfig
from otel_rollout.reports.lanes import C_TOOL, C_TURN, draw_lanes, lane_order
from otel_rollout.reports.steplog import read_log
from otel_rollout.semconv import (
    STEP_SPAN_NAME,
    STEP_TOOL_SHARE,
    TRAJECTORY_DURATION,
    TRAJECTORY_STATUS,
    TRAJECTORY_TURNS,
)
from otel_rollout.steps import StepScope
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


def test_turns_timed_by_the_client_are_labelled_so(
    otel: OTelHarness, make_telemetry: Callable[..., Telemetry]
) -> None:
    """A turn whose engine is in another process (verl's Ray call to its server) is timed by the
    loop's client; the span says whose clock timed its turns, ``mixed`` when both did."""
    telemetry = make_telemetry()
    with rollout_step(5) as step:
        with rollout_trajectory("remote") as remote:
            start = time.time_ns()
            time.sleep(0.04)  # the client's call
            remote.observe_turn(start, start + 40 * MS, 9)
        with rollout_trajectory("both") as both:
            start = time.time_ns()
            time.sleep(0.01)
            both.observe_turn(start, start + 10 * MS, 2)
            _turn(telemetry, 0.01, 3)
    spans = {s.name: s.attributes for s in otel.finished_spans()}
    a = spans["invoke_agent remote"]
    assert a["rollout.trajectory.turn_timing"] == "client_call"
    assert (a["rollout.trajectory.turns"], a["rollout.trajectory.output_tokens"]) == (1, 9)
    assert a["rollout.trajectory.generation_s"] == pytest.approx(0.04)
    assert spans["invoke_agent both"]["rollout.trajectory.turn_timing"] == "mixed"
    assert step.stats is not None and step.stats.trajectories is not None
    assert step.stats.trajectories.count == 2


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
    assert a["rollout.trajectory.turn_timing"] == "engine_request"  # turns are request records
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
    spans = otel.finished_spans()
    trajectories = [s for s in spans if s.name == "invoke_agent agent"]
    assert len(trajectories) == 3
    # each trajectory's tool time is its own tool span's (asserted, not the scheduler's
    # punctuality: a 10 ms sleep may take 20 ms on a busy machine) ...
    for traj in trajectories:
        (tool,) = [
            s
            for s in spans
            if s.name == "execute_tool sleep" and s.parent.span_id == traj.context.span_id
        ]
        assert traj.attributes["rollout.trajectory.tool_s"] == pytest.approx(
            (tool.end_time - tool.start_time) / 1e9, abs=1e-6
        )
    # ... and never less than what each coroutine slept: sorted, the k-th is at least k * 10 ms
    tool_s = sorted(s.attributes["rollout.trajectory.tool_s"] for s in trajectories)
    assert all(t >= 0.01 * k for k, t in enumerate(tool_s, 1)), tool_s


def test_an_unknown_status_is_bounded_on_the_metric(otel: OTelHarness) -> None:
    with rollout_trajectory() as t:
        t.set_status("made-up-by-the-loop")
    (span,) = [s for s in otel.finished_spans() if s.name.startswith("invoke_agent")]
    assert span.attributes[TRAJECTORY_STATUS] == "made-up-by-the-loop"
    labels = {p.attributes[TRAJECTORY_STATUS] for p in otel.metric_points(TRAJECTORY_DURATION)}
    assert labels == {"other"}


def test_the_step_reports_its_trajectories(
    otel: OTelHarness,
    make_telemetry: Callable[..., Telemetry],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Per-step trajectory figures: span, stats, summary, step log and PNG lanes, each against
    what the loop itself measured (tool seconds, turns) and the trajectory spans."""
    telemetry = make_telemetry()
    config = RolloutConfig(
        step_summary=True, step_log=str(tmp_path / "steps.jsonl"), report_dir=str(tmp_path)
    )
    own: dict[int, dict[str, float]] = {}
    with StepScope(9, config=config) as step:
        for sample, (turns, tool_s) in enumerate(((1, 0.0), (2, 0.06), (3, 0.02), (2, 0.12))):
            started = time.monotonic()
            with rollout_trajectory("coder", sample_id=sample) as traj:
                for turn in range(turns):
                    _turn(telemetry, 0.01, 4)
                    if turn == 0 and tool_s:
                        with rollout_tool("python"):
                            time.sleep(tool_s)
                if sample == 2:
                    traj.set_status("truncated")
            own[sample] = {"turns": turns, "tool_s": tool_s, "s": time.monotonic() - started}
    spans = otel.finished_spans()
    by_sample = {
        int(s.attributes["rollout.trajectory.sample_id"]): s
        for s in spans
        if s.name == "invoke_agent coder"
    }
    (step_span,) = [s for s in spans if s.name == STEP_SPAN_NAME]
    a = step_span.attributes
    durations = sorted((s.end_time - s.start_time) / 1e9 for s in by_sample.values())
    assert a["rollout.step.trajectories"] == 4
    assert (a["rollout.step.trajectory.turns.p50"], a["rollout.step.trajectory.turns.max"]) == (
        2,
        3,
    )
    assert a["rollout.step.trajectory.duration.max_s"] == pytest.approx(durations[-1], abs=1e-6)
    assert a["rollout.step.trajectory.duration.p50_s"] == pytest.approx(durations[1], abs=1e-6)
    tool_total = sum(s.attributes["rollout.trajectory.tool_s"] for s in by_sample.values())
    assert a["rollout.step.trajectory.tool_share"] == pytest.approx(
        tool_total / sum(durations),
        abs=1e-5,  # the spans' seconds are rounded to µs
    )
    # what the loop slept, at least, and never more than its trajectories lasted
    assert sum(v["tool_s"] for v in own.values()) <= tool_total <= sum(durations)
    for span in by_sample.values():
        tools = [
            s
            for s in spans
            if s.name == "execute_tool python" and s.parent.span_id == span.context.span_id
        ]
        assert span.attributes["rollout.trajectory.tool_s"] == pytest.approx(
            sum((t.end_time - t.start_time) / 1e9 for t in tools), abs=1e-6
        )
    slowest = sorted(by_sample.values(), key=lambda s: s.end_time - s.start_time, reverse=True)
    assert list(a["rollout.step.trajectory.slowest"]) == [
        f"{s.context.span_id:016x}" for s in slowest
    ]
    assert max(own, key=lambda k: own[k]["s"]) == int(
        slowest[0].attributes["rollout.trajectory.sample_id"]
    )
    # the step's point of the tool-share histogram, exemplar on the step span
    (point,) = otel.metric_points(STEP_TOOL_SHARE)
    assert point.sum == pytest.approx(a["rollout.step.trajectory.tool_share"])
    stats = step.stats
    assert stats is not None and stats.trajectories is not None
    assert stats.trajectories.statuses == {"completed": 3, "truncated": 1}
    # the terminal summary names the slowest trajectory by its span id
    err = capsys.readouterr().err
    assert "trajectories: 4 (completed 3 truncated 1) | turns p50 2 max 3" in err
    assert f"span_id={slowest[0].context.span_id:016x}" in err.split("slow trajectory:")[1]
    # the step log keeps each trajectory's turns and tool calls (relative to the step's t0)
    (entry,) = list(read_log(tmp_path / "steps.jsonl"))
    lanes = {t["span_id"]: t for t in entry["trajectories"]}
    t0 = entry["t0_unix_ns"]
    for sample, span in by_sample.items():
        lane = lanes[f"{span.context.span_id:016x}"]
        assert len(lane["turns"]) == own[sample]["turns"]
        assert len(lane["tools"]) == (1 if own[sample]["tool_s"] else 0)
        assert (lane["start_ns"] + t0, lane["end_ns"] + t0) == (span.start_time, span.end_time)
        tools = [
            s
            for s in spans
            if s.name == "execute_tool python" and s.parent.span_id == span.context.span_id
        ]
        assert [[s.start_time - t0, s.end_time - t0] for s in tools] == lane["tools"]
    # the PNG draws those lanes: every turn and tool call as a segment on its trajectory's row
    assert (tmp_path / "step-000009.png").stat().st_size > 10_000
    ax = Figure().subplots()
    draw_lanes(ax, entry["trajectories"], entry["stats"])
    order = lane_order(entry["trajectories"])
    for colour, key in ((C_TOOL, "tools"), (C_TURN, "turns")):
        expected = sorted(
            (row, start / 1e9) for row, lane in enumerate(order) for start, _ in lane[key]
        )
        drawn = _segments(ax, colour)
        assert [row for row, _ in drawn] == [row for row, _ in expected], key
        assert [x for _, x in drawn] == pytest.approx([x for _, x in expected]), key


def _segments(ax: Axes, colour: str) -> list[tuple[int, float]]:
    """(row, start in s) of every segment drawn in ``colour``."""
    rgb = tuple(int(colour[i : i + 2], 16) / 255 for i in (1, 3, 5))
    return sorted(
        (round(seg[0][1]), float(seg[0][0]))
        for collection in ax.collections
        if isinstance(collection, LineCollection)
        and tuple(collection.get_colors()[0][:3]) == pytest.approx(rgb)
        for seg in collection.get_segments()
    )
