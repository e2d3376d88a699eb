"""The real-engine check of ``examples/agent_loop.py``, shared by the vLLM and SGLang suites:
every figure of the trajectories and of their step against the loop's own record."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

import pytest

from otel_rollout.reports.steplog import read_log
from otel_rollout.semconv import STEP_SPAN_NAME, STEP_TOOL_SHARE, TRAJECTORY_DURATION

REPO = Path(__file__).resolve().parents[1]
LENGTHS = [(8, 24), (32, 4), (16, 16), (48, 8)]
"""(first turn, second turn) tokens per sample: exact lengths (``ignore_eos``)."""


def load_example() -> Any:
    spec = importlib.util.spec_from_file_location("agent_loop", REPO / "examples/agent_loop.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def run_and_check(
    otel: Any,
    generate: Any,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    step_number: int = 5,
) -> None:
    """Run one step of the example and compare spans, step figures, summary, step log and the
    PNG's lanes with what the loop recorded itself."""
    monkeypatch.setenv("OTEL_ROLLOUT_STEP_SUMMARY", "true")
    monkeypatch.setenv("OTEL_ROLLOUT_STEP_LOG", str(tmp_path / "steps.jsonl"))
    monkeypatch.setenv("OTEL_ROLLOUT_REPORT_DIR", str(tmp_path))
    samples = load_example().agent_loop(generate, step_number, LENGTHS)
    spans = otel.finished_spans()
    (step,) = [s for s in spans if s.name == STEP_SPAN_NAME]
    trajectories = {
        int(s.attributes["rollout.trajectory.sample_id"]): s
        for s in spans
        if s.name == "invoke_agent tool_agent"
    }
    assert sorted(trajectories) == [s.sample_id for s in samples]
    requests = [s for s in spans if s.attributes.get("gen_ai.usage.output_tokens") is not None]
    assert step.attributes["rollout.step.requests"] == len(requests) == 2 * len(LENGTHS)
    for sample, (first, second) in zip(samples, LENGTHS, strict=True):
        span = trajectories[sample.sample_id]
        a = span.attributes
        assert span.parent.span_id == step.context.span_id
        assert a["rollout.step"] == step_number
        assert a["rollout.trajectory.group_id"] == str(sample.sample_id // 2)
        assert a["rollout.trajectory.turns"] == sample.turns == 2
        assert a["rollout.trajectory.output_tokens"] == sample.output_tokens == first + second
        assert a["rollout.trajectory.tool_calls"] == sample.tool_calls == 1
        assert a["rollout.trajectory.reward"] == sample.reward
        # the engine's own request times lie inside the loop's generate calls
        assert 0 < a["rollout.trajectory.generation_s"] <= sample.generate_s + 0.002
        assert a["rollout.trajectory.turn_timing"] == "engine_request"
        assert a["rollout.trajectory.tool_s"] == pytest.approx(sample.tool_s, abs=0.003)
        assert (span.end_time - span.start_time) / 1e9 == pytest.approx(sample.wall_s, abs=0.003)
        # every turn's request span is under its trajectory (directly or through a batch span)
        batches = {
            s.context.span_id
            for s in spans
            if s.name.startswith("rollout.batch") and s.parent.span_id == span.context.span_id
        }
        turns = [r for r in requests if r.parent.span_id in batches | {span.context.span_id}]
        assert sorted(r.attributes["gen_ai.usage.output_tokens"] for r in turns) == sorted(
            [first, second]
        )
        tool = next(
            s
            for s in spans
            if s.name == "execute_tool python" and s.parent.span_id == span.context.span_id
        )
        assert tool.attributes["gen_ai.tool.call.id"] == f"{sample.sample_id}-0"
    # content stays off by default: no prompt or completion text on any span
    assert not any("gen_ai.input.messages" in s.attributes for s in spans)
    assert not any("gen_ai.output.messages" in s.attributes for s in spans)
    assert not any("gen_ai.tool.call.arguments" in s.attributes for s in spans)
    points = otel.metric_points(TRAJECTORY_DURATION)
    assert sum(p.count for p in points) == len(LENGTHS)

    # the step's trajectory figures, against the loop's record
    s = step.attributes
    walls = sorted(x.wall_s for x in samples)
    assert s["rollout.step.trajectories"] == len(samples)
    assert (s["rollout.step.trajectory.turns.p50"], s["rollout.step.trajectory.turns.max"]) == (
        2,
        2,
    )
    assert s["rollout.step.trajectory.duration.max_s"] == pytest.approx(walls[-1], abs=0.003)
    assert s["rollout.step.trajectory.tool_share"] == pytest.approx(
        sum(x.tool_s for x in samples) / sum(walls), abs=0.01
    )
    slowest = max(samples, key=lambda x: x.wall_s)
    assert s["rollout.step.trajectory.slowest"][0] == (
        f"{trajectories[slowest.sample_id].context.span_id:016x}"
    )
    (point,) = otel.metric_points(STEP_TOOL_SHARE)
    assert point.sum == pytest.approx(s["rollout.step.trajectory.tool_share"])
    err = capsys.readouterr().err
    assert f"trajectories: {len(samples)} (completed {len(samples)}) | turns p50 2 max 2" in err
    (entry,) = list(read_log(tmp_path / "steps.jsonl"))
    assert sorted(len(t["turns"]) for t in entry["trajectories"]) == [2] * len(samples)
    assert sorted(len(t["tools"]) for t in entry["trajectories"]) == [1] * len(samples)
    assert (tmp_path / f"step-{step_number:06d}.png").stat().st_size > 10_000
