"""Agentic trajectories on the real vLLM CPU engine: ``examples/agent_loop.py`` (two turns, a
real subprocess tool, a reward per sample) — the spans equal the loop's own record."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

import pytest

from otel_rollout.semconv import STEP_SPAN_NAME, TRAJECTORY_DURATION
from tests.conftest import OTelHarness

pytestmark = pytest.mark.vllm

REPO = Path(__file__).resolve().parents[2]


def _example() -> Any:
    spec = importlib.util.spec_from_file_location("agent_loop", REPO / "examples/agent_loop.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_each_sample_is_one_trajectory_of_its_turns_tool_and_reward(
    otel: OTelHarness, llm: Any, vllm_module: Any
) -> None:
    example = _example()
    lengths = [(8, 24), (32, 4), (16, 16), (48, 8)]
    samples = example.agent_loop(llm, vllm_module, 5, lengths)
    spans = otel.finished_spans()
    step = next(s for s in spans if s.name == STEP_SPAN_NAME)
    trajectories = {
        int(s.attributes["rollout.trajectory.sample_id"]): s
        for s in spans
        if s.name == "invoke_agent tool_agent"
    }
    assert sorted(trajectories) == [s.sample_id for s in samples]
    requests = [s for s in spans if s.attributes.get("gen_ai.usage.output_tokens") is not None]
    assert step.attributes["rollout.step.requests"] == len(requests) == 2 * len(lengths)
    for sample, (first, second) in zip(samples, lengths, strict=True):
        span = trajectories[sample.sample_id]
        a = span.attributes
        assert span.parent.span_id == step.context.span_id
        assert a["rollout.step"] == 5
        assert a["rollout.trajectory.group_id"] == str(sample.sample_id // 2)
        assert a["rollout.trajectory.turns"] == sample.turns == 2
        assert a["rollout.trajectory.output_tokens"] == sample.output_tokens == first + second
        assert a["rollout.trajectory.tool_calls"] == sample.tool_calls == 1
        assert a["rollout.trajectory.reward"] == sample.reward
        # the engine's own request times lie inside the loop's generate calls
        assert 0 < a["rollout.trajectory.generation_s"] <= sample.generate_s + 0.002
        assert a["rollout.trajectory.tool_s"] == pytest.approx(sample.tool_s, abs=0.003)
        # every turn's request span is under its trajectory (through the batch span)
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
    points = otel.metric_points(TRAJECTORY_DURATION)
    assert sum(p.count for p in points) == len(lengths)
