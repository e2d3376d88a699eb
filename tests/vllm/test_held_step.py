"""A weight sync inside a step on real vLLM (issue #42): the step's time while the engine was
held is ``held``, whether the engine's own call took it or the trainer held the engine paused.

Eight requests of 96 tokens start; once the first output is out, the trainer pauses generation
(``pause_generation(mode="keep")``: in-flight requests frozen, resumed later — a partial
rollout's weight update), spends a second on its own side of the sync (a stand-in for the
trainer's broadcast, which no engine call shows), reloads the weights through vLLM's worker RPC
and resumes. The requests then finish; the step waited mostly on the held engine.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from otel_rollout import rollout_step
from tests.conftest import OTelHarness

pytestmark = pytest.mark.vllm

HELD_S = 1.0


def test_a_weight_sync_inside_the_step_is_held(
    otel: OTelHarness, engine: Any, vllm_module: Any, loop: asyncio.AbstractEventLoop
) -> None:
    params = vllm_module.SamplingParams(max_tokens=96, ignore_eos=True)
    first_output = asyncio.Event()

    async def one(i: int) -> int:
        tokens = 0
        async for out in engine.generate(f"Question {i}:", params, request_id=f"held-{i}"):
            tokens = len(out.outputs[0].token_ids)
            first_output.set()
        return tokens

    async def step() -> list[int]:
        async with rollout_step(77):
            requests = [asyncio.ensure_future(one(i)) for i in range(8)]
            await first_output.wait()
            await engine.pause_generation(mode="keep", clear_cache=False)
            await asyncio.sleep(HELD_S)  # the trainer's side of the sync: no engine call
            await engine.collective_rpc("reload_weights")
            await engine.resume_generation()
            return list(await asyncio.gather(*requests))

    assert loop.run_until_complete(step()) == [96] * 8
    (span,) = [s for s in otel.finished_spans() if s.name == "rollout.step"]
    assert span.attributes["rollout.step"] == 77
    assert span.attributes["rollout.step.cause.dominant"] == "held"
    held = span.attributes["rollout.step.cause.held_s"]
    assert held >= HELD_S  # the pause lasted at least the trainer's second
    causes = {
        k.removeprefix("rollout.step.cause.").removesuffix("_s"): v
        for k, v in span.attributes.items()
        if k.startswith("rollout.step.cause.") and k.endswith("_s")
    }
    duration_s = (span.end_time - span.start_time) / 1e9
    assert sum(causes.values()) == pytest.approx(duration_s, rel=0.01)
    # the engine's own calls are the step's phases; the time paused between them is held too
    phases = {
        k.removeprefix("rollout.step.phase.").removesuffix(".duration_s")
        for k in span.attributes
        if k.startswith("rollout.step.phase.")
    }
    assert {"generation_pause", "weight_sync", "generation_resume"} <= phases
