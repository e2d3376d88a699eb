"""verl's ``ToolAgentLoop._call_tool`` under the agent-loop hook (issue #17), on verl's own code.

The multi-turn tool loop needs a model that emits tool calls, which the tiny random model does
not; the rollout itself is test_verl_rollout.py. Here verl's real ``_call_tool`` runs a real tool
— a ``FunctionTool`` registered with verl's ``function_tool`` that executes Python in a
subprocess — wrapped the way ``VerlInstrumentor`` wraps it: inside a trajectory each call is an
``execute_tool <name>`` span whose seconds the trajectory counts, verl's result is verl's, a
failing tool is still verl's own error response, and outside a trajectory nothing is made.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from typing import Any

import pytest
import wrapt

from otel_rollout import rollout_step
from otel_rollout.frameworks import verl_agent_loop as hook
from otel_rollout.trajectories import rollout_trajectory
from tests.conftest import OTelHarness

pytestmark = pytest.mark.verl


def run_python(code: str) -> str:
    """Run a Python snippet and return what it printed.

    Args:
        code: the Python source to run.
    """
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=30, check=False
    )
    if done.returncode:
        raise RuntimeError(done.stderr.strip().splitlines()[-1])
    return done.stdout.strip()


@pytest.fixture(scope="module")
def loop(verl_module: Any) -> Any:
    """verl's ``ToolAgentLoop`` with only what ``_call_tool`` reads, its tool verl's own
    ``FunctionTool``, and ``_call_tool`` wrapped as the instrumentor wraps it."""
    from verl.experimental.agent_loop.tool_agent_loop import ToolAgentLoop
    from verl.tools.function_tool import FUNCTION_TOOL_REGISTRY, function_tool

    function_tool("run_python")(run_python)

    class Loop(ToolAgentLoop):  # type: ignore[misc]
        _call_tool = wrapt.FunctionWrapper(ToolAgentLoop._call_tool, hook.call_tool_wrapper)

    instance = object.__new__(Loop)
    instance.tools = {"run_python": FUNCTION_TOOL_REGISTRY["run_python"]}
    instance.max_tool_response_length = 256
    instance.tool_response_truncate_side = "middle"
    return instance


def call(loop: Any, code: str, call_id: str) -> Any:
    from verl.experimental.agent_loop.tool_parser import FunctionCall

    arguments = json.dumps({"code": code})  # as the model generates it
    tool_call = FunctionCall(name="run_python", arguments=arguments, tool_call_id=call_id)
    return asyncio.run(loop._call_tool(tool_call, {}, object()))


def test_each_tool_call_is_a_span_of_the_trajectory(otel: OTelHarness, loop: Any) -> None:
    with rollout_step(2):
        with rollout_trajectory("tool_agent", sample_id="0-0") as trajectory:
            started = time.monotonic()
            response, reward, _ = call(loop, "print(6 * 7)", "call-1")
            took = time.monotonic() - started
            failed, _, _ = call(loop, "1 / 0", "call-2")
    assert response.text == "42" and reward == 0.0  # verl's own result
    assert "ZeroDivisionError" in failed.text  # verl's own error response for a failing tool
    spans = otel.finished_spans()
    tools = sorted(
        (s for s in spans if s.name == "execute_tool run_python"),
        key=lambda s: s.attributes["gen_ai.tool.call.id"],
    )
    (span,) = [s for s in spans if s.name == "invoke_agent tool_agent"]
    assert [t.attributes["gen_ai.tool.call.id"] for t in tools] == ["call-1", "call-2"]
    assert all(t.parent.span_id == span.context.span_id for t in tools)
    assert all(t.attributes["gen_ai.tool.name"] == "run_python" for t in tools)
    assert "code" not in str([dict(t.attributes) for t in tools])  # the tool's input is content
    first = (tools[0].end_time - tools[0].start_time) / 1e9
    assert 0 < first <= took
    busy = sum((t.end_time - t.start_time) / 1e9 for t in tools)
    assert span.attributes["rollout.trajectory.tool_calls"] == 2
    assert span.attributes["rollout.trajectory.tool_s"] == pytest.approx(busy, abs=0.002)
    assert trajectory.duration_s is not None and busy <= trajectory.duration_s


def test_a_tool_call_outside_a_trajectory_is_verls_alone(otel: OTelHarness, loop: Any) -> None:
    response, _, _ = call(loop, "print('alone')", "call-3")
    assert response.text == "alone"
    assert otel.finished_spans() == []
