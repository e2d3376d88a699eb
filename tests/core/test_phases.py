"""Step phases (``rollout_phase``): spans under the step, totals on it, one bounded metric."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from typing import Any

import pytest

from otel_rollout import phases, rollout_phase, rollout_step
from otel_rollout.attribution import CAUSES
from otel_rollout.semconv import PHASE_NAME, STEP_PHASE_DURATION, STEP_SPAN_NAME
from tests.conftest import OTelHarness


def _by_name(otel: OTelHarness) -> dict[str, Any]:
    return {s.name: s for s in otel.finished_spans()}


def _labels(otel: OTelHarness) -> Counter[str]:
    return Counter(
        {
            p.attributes[PHASE_NAME]: p.count
            for p in otel.metric_points(STEP_PHASE_DURATION)
            if p.count
        }
    )


def test_phases_nest_under_the_step_and_split_its_time(otel: OTelHarness) -> None:
    with rollout_step(7) as step:
        with rollout_phase("reward") as reward:
            time.sleep(0.05)
        with rollout_phase("update") as update:
            with rollout_phase("inner") as inner:
                time.sleep(0.02)
            time.sleep(0.02)
        with rollout_phase("reward") as again:  # verl sums a name timed twice; so do we
            time.sleep(0.01)
        time.sleep(0.04)  # covered by no phase
    spans = _by_name(otel)
    step_span = spans[STEP_SPAN_NAME]
    for name in ("rollout.phase update",):
        assert spans[name].parent.span_id == step_span.context.span_id
    assert (
        spans["rollout.phase inner"].parent.span_id == spans["rollout.phase update"].context.span_id
    )
    assert {
        s.attributes[PHASE_NAME] for s in spans.values() if s.name.startswith("rollout.phase")
    } == {
        "reward",
        "update",
        "inner",
    }
    attrs = step_span.attributes
    assert reward.seconds is not None and again.seconds is not None and update.seconds is not None
    assert attrs["rollout.step.phase.reward.duration_s"] == pytest.approx(
        reward.seconds + again.seconds, abs=1e-5
    )
    assert attrs["rollout.step.phase.update.duration_s"] == pytest.approx(update.seconds, abs=1e-5)
    assert "rollout.step.phase.inner.duration_s" not in attrs  # nested: inside update's total
    assert inner.seconds is not None and inner.seconds < update.seconds
    step_s = (step_span.end_time - step_span.start_time) / 1e9
    covered = reward.seconds + again.seconds + update.seconds
    assert attrs["rollout.step.unaccounted_s"] == pytest.approx(step_s - covered, abs=0.005)
    assert attrs["rollout.step.unaccounted_s"] >= 0.04
    assert step.phases.keys() == {"reward", "update"}
    assert _labels(otel) == Counter({"reward": 2, "update": 1, "inner": 1})


def test_the_wrapped_codes_exception_passes_through(otel: OTelHarness) -> None:
    class Boom(Exception):
        pass

    error = Boom("verl's own")
    with pytest.raises(Boom) as caught, rollout_step(1), rollout_phase("update_actor"):
        raise error
    assert caught.value is error
    spans = _by_name(otel)
    assert spans["rollout.phase update_actor"].status.is_ok is False
    assert "rollout.step.phase.update_actor.duration_s" in spans[STEP_SPAN_NAME].attributes


def test_async_and_decorator_forms(otel: OTelHarness) -> None:
    @rollout_phase("reward")
    async def score() -> str:
        await asyncio.sleep(0.01)
        return "scored"

    @rollout_phase("advantage")
    def advantage() -> int:
        return 3

    async def step() -> tuple[str, int]:
        async with rollout_step(2):
            async with rollout_phase("gen"):
                await asyncio.sleep(0.01)
            return await score(), advantage()

    assert asyncio.run(step()) == ("scored", 3)
    attrs = _by_name(otel)[STEP_SPAN_NAME].attributes
    assert {k for k in attrs if k.startswith("rollout.step.phase.")} == {
        "rollout.step.phase.gen.duration_s",
        "rollout.step.phase.reward.duration_s",
        "rollout.step.phase.advantage.duration_s",
    }


def test_a_phase_outside_a_step_is_a_span_and_a_point(otel: OTelHarness) -> None:
    with rollout_phase("checkpoint"):
        pass
    (span,) = otel.finished_spans()
    assert span.name == "rollout.phase checkpoint" and span.parent is None
    assert _labels(otel) == Counter({"checkpoint": 1})


def test_phase_names_stay_bounded(
    otel: OTelHarness, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(phases, "MAX_PHASE_NAMES", 2)
    monkeypatch.setattr(phases, "_names", set())
    with rollout_step(1):
        for i in range(4):
            with rollout_phase(f"reward_{i}"):
                pass
    assert _labels(otel) == Counter({"reward_0": 1, "reward_1": 1, "other": 2})
    spans = [s for s in otel.finished_spans() if s.name.startswith("rollout.phase")]
    assert sorted(s.attributes[PHASE_NAME] for s in spans) == [f"reward_{i}" for i in range(4)]
    warnings = [r for r in caplog.records if "distinct phase names" in r.getMessage()]
    assert len(warnings) == 1


def test_the_step_timeline_in_summary_step_log_and_png(
    otel: OTelHarness,
    make_telemetry: Any,
    model: str,
    tmp_path: Any,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The step's top-level phases as its timeline: a summary line with each phase's seconds and
    the unaccounted rest, the phases in the step log (times relative to the step's t0, as the
    spans have them), and a lane above the request waterfall in the PNG."""
    from otel_rollout.config import RolloutConfig
    from otel_rollout.reports.steplog import read_log
    from otel_rollout.steps import StepScope
    from testkit.records import make_record

    telemetry = make_telemetry()
    config = RolloutConfig(
        step_summary=True, step_log=str(tmp_path / "steps.jsonl"), report_dir=str(tmp_path)
    )
    with StepScope(21, config=config, telemetry=telemetry) as step:
        with rollout_phase("generation"):
            telemetry.emit(make_record(model, arrival_ns=time.time_ns() - 30_000_000))
            time.sleep(0.03)
        with rollout_phase("weight_sync"):
            time.sleep(0.02)
        time.sleep(0.01)  # covered by no phase
    spans = {s.name: s for s in otel.finished_spans()}
    err = capsys.readouterr().err
    (line,) = [x for x in err.splitlines() if x.startswith("  phases: ")]
    totals = dict(step.phases)
    assert line == (
        f"  phases: generation {totals['generation']:.2f} s, weight_sync "
        f"{totals['weight_sync']:.2f} s | unaccounted "
        f"{step.stats.duration_s - sum(totals.values()):.2f} s"  # type: ignore[union-attr]
    )
    (entry,) = list(read_log(tmp_path / "steps.jsonl"))
    t0 = entry["t0_unix_ns"]
    assert [(p["name"], p["start_ns"] + t0, p["end_ns"] + t0) for p in entry["phases"]] == [
        (name, spans[f"rollout.phase {name}"].start_time, spans[f"rollout.phase {name}"].end_time)
        for name in ("generation", "weight_sync")
    ]
    # The PNG gets the lane: drawn from the same entry, one bar per phase on the time axis.
    from matplotlib.figure import Figure

    from otel_rollout.reports.png import _waterfall
    from otel_rollout.reports.timeline import timeline_lane

    assert (tmp_path / "step-000021.png").stat().st_size > 10_000
    lane, below = Figure().subplots(2, 1)
    _waterfall(below, entry["requests"], entry["stats"])
    timeline_lane(lane, below, entry["phases"], [])
    bars = [
        (round(float(path.vertices[:, 0].min()), 6), round(float(path.vertices[:, 0].max()), 6))
        for collection in lane.collections
        for path in collection.get_paths()
    ]
    assert bars == [
        (round(p["start_ns"] / 1e9, 6), round(p["end_ns"] / 1e9, 6)) for p in entry["phases"]
    ]
    assert lane.get_xlim() == below.get_xlim()
    assert lane.get_xlim()[1] >= entry["phases"][-1]["end_ns"] / 1e9
    # The cause band under the phases: the step's time in order, one bar per piece of its path,
    # from its start to its end (relative to the first arrival, like the rest of the entry).
    causes = entry["causes"]
    assert causes and all(c["cause"] in CAUSES for c in causes)
    assert all(a["end_ns"] <= b["start_ns"] for a, b in zip(causes, causes[1:], strict=False))
    span = spans["rollout.step"]
    assert causes[0]["start_ns"] + t0 == span.start_time
    assert causes[-1]["end_ns"] + t0 == span.end_time
    seconds = {c: 0.0 for c in CAUSES}
    for c in causes:
        seconds[c["cause"]] += (c["end_ns"] - c["start_ns"]) / 1e9
    assert seconds == pytest.approx(step.stats.causes.seconds, abs=1e-6)  # type: ignore[union-attr]
    # weight_sync is held; the 10 ms no phase covered is the framework's
    assert seconds["held"] > 0 and seconds["framework_gap"] > 0
    lane, below = Figure().subplots(2, 1)
    timeline_lane(lane, below, entry["phases"], causes)
    assert len([p for c in lane.collections for p in c.get_paths()]) == len(entry["phases"]) + len(
        causes
    )
    assert [t.get_text() for t in lane.get_yticklabels()] == ["why", "phases"]
