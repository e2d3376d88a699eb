"""An agentic step with a slow tool on real vLLM (issue #42): the step waited on the tool.

Four trajectories run at once on an ``AsyncLLM`` (as agent loops do): each a turn of 24
tokens, a tool call, a second turn of 24 tokens. Three tools answer in 20 ms; one takes a
second (a subprocess that sleeps). That trajectory's second turn is the step's last request,
sent a second late: its wait on the tool is ``agentic_wait``, the step's dominant cause.
"""

from __future__ import annotations

import asyncio
import sys
from typing import Any

import pytest

from otel_rollout import rollout_step
from otel_rollout.trajectories import rollout_tool, rollout_trajectory
from tests.conftest import OTelHarness

pytestmark = pytest.mark.vllm

SLOW_S = 1.0


async def _tool(seconds: float) -> None:
    """A real tool: a Python subprocess that takes ``seconds``."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", f"import time; time.sleep({seconds})"
    )
    assert await proc.wait() == 0


def test_a_slow_tool_call_is_what_the_step_waited_on(
    otel: OTelHarness, engine: Any, vllm_module: Any, loop: asyncio.AbstractEventLoop
) -> None:
    params = vllm_module.SamplingParams(max_tokens=24, ignore_eos=True)

    async def turn(rid: str) -> int:
        outputs = [out async for out in engine.generate(f"Question {rid}:", params, rid)]
        return len(outputs[-1].outputs[0].token_ids)

    async def agent(i: int, tool_s: float) -> int:
        async with rollout_trajectory("tool_agent", sample_id=i):
            tokens = await turn(f"agent-{i}-0")
            async with rollout_tool("python", call_id=str(i)):
                await _tool(tool_s)
            return tokens + await turn(f"agent-{i}-1")

    async def step() -> Any:
        async with rollout_step(88) as scope:
            tokens = await asyncio.gather(*(agent(i, SLOW_S if i == 2 else 0.02) for i in range(4)))
        assert tokens == [48] * 4
        return scope.stats

    stats = loop.run_until_complete(step())
    assert stats is not None and stats.causes is not None
    causes = stats.causes
    assert causes.dominant == "agentic_wait"
    # the tool's own second is inside it (a subprocess starts in well under a second here)
    assert SLOW_S <= causes.seconds["agentic_wait"] <= stats.duration_s
    assert sum(causes.seconds.values()) == pytest.approx(stats.duration_s, rel=0.01)
    assert stats.trajectories is not None and stats.trajectories.count == 4
    (span,) = [s for s in otel.finished_spans() if s.name == "rollout.step"]
    assert span.attributes["rollout.step.cause.dominant"] == "agentic_wait"
