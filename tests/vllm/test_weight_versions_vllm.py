"""The engine's own weight versions on real vLLM 0.32 (issue #40 item 1).

vLLM labels every engine step with the version of the weights it ran, and tells, per finished
completion, which version generated which output tokens (``CompletionOutput.weight_versions``).
Versions are named through its own API: ``update_weight_version``,
``finish_weight_update(weight_version=)``, ``LLMEngine.set_weight_version``. A request's span
carries the engine's label, says so (``rollout.weight.version_source = engine``), and a request
generated under two versions (a sync landing mid-request: partial rollout) shows both and how many
tokens each generated, as the engine counted them.

This module names the engines' weights, which stops counting for the rest of the process: it
runs last in tests/vllm (the other modules assert counted versions).
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from otel_rollout import rollout_step
from otel_rollout.vllm.adapter import model_name
from testkit.engines import vllm_telemetry
from tests.conftest import OTelHarness

pytestmark = pytest.mark.vllm


def _request_spans(otel: OTelHarness, ids: set[str]) -> dict[str, Any]:
    return {
        s.attributes["gen_ai.response.id"]: s
        for s in otel.finished_spans()
        if s.attributes.get("gen_ai.response.id") in ids
    }


def _versions(output: Any) -> list[tuple[str, int]]:
    """The engine's own (version, tokens) of a finished output, summed over its samples."""
    merged: dict[str, int] = {}
    for choice in output.outputs:
        for span in choice.weight_versions or ():
            merged[span.version] = merged.get(span.version, 0) + span.end - span.start
    return list(merged.items())


def test_a_sync_through_vllms_own_api_names_the_next_steps_version(
    otel: OTelHarness, engine: Any, vllm_module: Any, loop: asyncio.AbstractEventLoop
) -> None:
    """The issue's reproduction: two steps, between them pause → reload → name "v2" → resume.
    Step 2's requests carry "v2", the engine's own label; step 1's do not."""
    params = vllm_module.SamplingParams(max_tokens=6, ignore_eos=True)
    last: dict[str, Any] = {}

    async def generate(rid: str) -> None:
        async for out in engine.generate(f"prompt {rid}", params, rid):
            last[rid] = out

    async def wave(prefix: str) -> None:
        await asyncio.gather(*(generate(f"{prefix}{i}") for i in range(4)))

    async def sync() -> None:
        await engine.pause_generation()
        await engine.collective_rpc("reload_weights")
        await engine.update_weight_version("v2")
        await engine.resume_generation()

    with rollout_step(1):
        loop.run_until_complete(wave("one-"))
    loop.run_until_complete(sync())
    with rollout_step(2):
        loop.run_until_complete(wave("two-"))

    assert loop.run_until_complete(engine.get_weight_version()) == "v2"
    spans = _request_spans(otel, set(last))
    assert len(spans) == 8
    for rid, span in spans.items():
        a = span.attributes
        if rid.startswith("two-"):
            assert _versions(last[rid]) == [("v2", 6)]  # the engine's own word
            assert (a["rollout.weight.version"], a["rollout.weight.version_source"]) == (
                "v2",
                "engine",
            )
            assert "rollout.weight.versions" not in a  # one version: no per-token split
        else:
            assert _versions(last[rid]) == [("default", 6)]  # nothing had named the weights
            assert a.get("rollout.weight.version") != "v2"
            assert a.get("rollout.weight.version_source") in (None, "counted")
    # the name reached our own record of the engine's versions too (for the step's staleness)
    activity = vllm_telemetry().engine_activity(model_name(engine))
    assert activity.weights.current == "v2"


def test_a_sync_mid_request_shows_both_versions_and_their_tokens(
    otel: OTelHarness, engine: Any, vllm_module: Any, loop: asyncio.AbstractEventLoop
) -> None:
    """Partial rollout: requests are generating when the engine pauses (keeping them), loads
    weights, is named "1002" and resumes; each request shows versions [1001, 1002] with the
    engine's own token counts, and the step's staleness is measured from its oldest version."""
    total = 600
    params = vllm_module.SamplingParams(max_tokens=total, ignore_eos=True)
    seen: dict[str, int] = {}
    last: dict[str, Any] = {}
    generating = {f"p{i}": asyncio.Event() for i in range(3)}

    async def generate(rid: str) -> None:
        async for out in engine.generate(f"prompt {rid}", params, rid):
            last[rid] = out
            seen[rid] = len(out.outputs[0].token_ids)
            if seen[rid] >= 4:
                generating[rid].set()

    async def run() -> dict[str, int]:
        await engine.update_weight_version("1001")
        tasks = [asyncio.ensure_future(generate(rid)) for rid in generating]
        for event in generating.values():
            await event.wait()
        await engine.pause_generation(mode="keep", clear_cache=False)
        before = dict(seen)  # tokens delivered before the pause: all generated by 1001
        await engine.collective_rpc("reload_weights")
        await engine.update_weight_version("1002")
        await engine.resume_generation()
        await asyncio.gather(*tasks)
        return before

    with rollout_step(3) as step:
        before = loop.run_until_complete(run())

    spans = _request_spans(otel, set(generating))
    assert len(spans) == 3
    for rid, span in spans.items():
        a = span.attributes
        engine_says = _versions(last[rid])
        assert [v for v, _ in engine_says] == ["1001", "1002"], engine_says
        old, new = (n for _, n in engine_says)
        assert old + new == total and new > 0
        assert old >= before[rid] >= 4  # what the caller had received came from 1001
        assert list(a["rollout.weight.versions"]) == ["1001", "1002"]
        assert list(a["rollout.weight.version_tokens"]) == [old, new]
        assert (a["rollout.weight.version"], a["rollout.weight.version_source"]) == (
            1001,
            "engine",
        )
    staleness = step.stats.staleness if step.stats else None
    assert staleness is not None
    assert (staleness.current, staleness.max, staleness.stale_requests) == (1002, 1, 3)


def test_offline_engine_named_through_set_weight_version(
    otel: OTelHarness, llm: Any, vllm_module: Any
) -> None:
    """``LLM`` has no naming method of its own; its ``LLMEngine.set_weight_version`` names the
    weights, and the offline requests carry the engine's label."""
    llm.llm_engine.set_weight_version("7")
    outputs = llm.generate(
        [f"offline {i}" for i in range(3)],
        vllm_module.SamplingParams(max_tokens=5, ignore_eos=True),
    )
    ids = {o.request_id for o in outputs}
    assert all(_versions(o) == [("7", 5)] for o in outputs)
    spans = _request_spans(otel, ids)
    assert len(spans) == 3
    for span in spans.values():
        assert (
            span.attributes["rollout.weight.version"],
            span.attributes["rollout.weight.version_source"],
        ) == (7, "engine")
    activity = vllm_telemetry().engine_activity(model_name(llm.llm_engine))
    assert activity.weights.current == 7
