"""Weight sync, memory release / resume and pause / continue on the real SGLang CPU engine
(issue #13 item 1).

A step as an RL trainer runs it against SGLang: generate → pause generation → reload the weights
from disk through SGLang's own ``update_weights_from_disk`` (the same tiny weights: what matters is
the real code path) → continue → generate again. The test times each call on its own clock; the
phase spans, the step's totals and the engine's held time must agree with that timeline, and
SGLang's results must be what it returned.

``release_memory_occupation`` / ``resume_memory_occupation`` cannot run on this CPU machine: the
scheduler calls ``torch.cuda.synchronize()`` there (SGLang 0.5.23,
``weight_updater.py:379``) and dies. Those two targets are checked against every release's
source by ``tests/compat/test_sglang_contract.py`` only.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry.trace import StatusCode

from otel_rollout import rollout_step
from otel_rollout.sglang import adapter
from tests.conftest import OTelHarness
from tests.sglang.conftest import start_engine
from tests.sglang.helpers import params

pytestmark = pytest.mark.sglang


@pytest.fixture(scope="module")
def engine(sglang_module: Any, tiny_model: str, instrumented: Any) -> Iterator[Any]:
    eng = start_engine(sglang_module, tiny_model)
    yield eng
    eng.shutdown()


def _telemetry(engine: Any) -> Any:
    from sglang.srt.managers.tokenizer_manager import TokenizerManager

    from otel_rollout.telemetry import Telemetry

    wrapper = TokenizerManager.__dict__["generate_request"]._self_wrapper
    for cell in wrapper.__closure__ or ():
        if isinstance(cell.cell_contents, Telemetry):
            return cell.cell_contents
    raise AssertionError("SGLang is not instrumented")


def test_weight_update_and_pause_are_phases_of_the_step(
    otel: OTelHarness, engine: Any, tiny_model: str
) -> None:
    from sglang.srt.managers.io_struct import (
        ContinueGenerationReqInput,
        PauseGenerationReqInput,
    )

    manager = engine.tokenizer_manager
    activity = _telemetry(engine).engine_activity(adapter.model_name(manager))
    calls: dict[str, tuple[int, int]] = {}

    def timed(name: str, call: Any) -> Any:
        start = time.time_ns()
        try:
            return call()
        finally:
            calls[name] = (start, time.time_ns())

    held0 = activity.totals()[2]
    base = activity.weights.current
    with rollout_step(4) as scope:
        first = engine.generate(prompt="def f():", sampling_params=params(6))
        timed(
            "pause",
            lambda: engine.loop.run_until_complete(
                manager.pause_generation(PauseGenerationReqInput())
            ),
        )
        time.sleep(0.2)  # the trainer's update would run here, generation paused
        updated = timed("update", lambda: engine.update_weights_from_disk(tiny_model))
        timed(
            "continue",
            lambda: engine.loop.run_until_complete(
                manager.continue_generation(ContinueGenerationReqInput())
            ),
        )
        second = engine.generate(prompt="def g():", sampling_params=params(5))
    held = activity.totals()[2] - held0

    assert updated[0] is True, updated  # SGLang's own (success, message, …), unchanged
    assert len(first["output_ids"]) == 6 and len(second["output_ids"]) == 5
    # The update is counted: the request after it runs the next weight version.
    versions = {
        s.attributes["gen_ai.response.id"]: s.attributes.get("rollout.weight.version")
        for s in otel.finished_spans()
        if "gen_ai.response.id" in s.attributes
    }
    assert versions[second["meta_info"]["id"]] == base + 1
    first_version = versions[first["meta_info"]["id"]]
    assert first_version in (None, base)  # before any update was seen: no version at all
    assert scope.stats is not None and scope.stats.staleness is not None
    staleness = scope.stats.staleness
    assert staleness.current == base + 1
    assert staleness.max == (0 if first_version is None else 1)

    spans = [s for s in otel.finished_spans() if s.name.startswith("rollout.phase ")]
    by_kind = {s.attributes["rollout.phase.name"]: s for s in spans}
    assert len(by_kind) == len(spans) == 3
    (step,) = [s for s in otel.finished_spans() if s.name == "rollout.step"]
    for kind, call, method in (
        ("generation_pause", "pause", "pause_generation"),
        ("weight_sync", "update", "update_weights_from_disk"),
        ("generation_resume", "continue", "continue_generation"),
    ):
        span = by_kind[kind]
        start, end = calls[call]
        assert start <= span.start_time <= span.end_time <= end, kind
        assert span.parent.span_id == step.context.span_id
        assert span.instrumentation_scope.name == "otel_rollout.sglang"
        assert span.attributes["rollout.phase.framework"] == "sglang"
        assert span.attributes["rollout.phase.framework_name"] == f"TokenizerManager.{method}"
        assert span.status.status_code != StatusCode.ERROR
        total = step.attributes[f"rollout.step.phase.{kind}.duration_s"]
        assert total == pytest.approx((span.end_time - span.start_time) / 1e9, abs=1e-3)
    # Held from the pause's start to the continue's end: paused is neither busy nor idle.
    paused = (calls["continue"][1] - calls["pause"][0]) / 1e9
    assert 0.2 <= held <= paused + 0.05, (held, paused)
    assert not activity.states and activity.operations_running == 0


def test_the_engines_own_weight_version_names_each_request(
    otel: OTelHarness, engine: Any, tiny_model: str
) -> None:
    """Issue #40 item 1 on SGLang 0.5.23: a weight update naming its version
    (``UpdateWeightFromDiskReqInput.weight_version``) and a rename without loading
    (``TokenizerManager.update_weight_version``): each request's span carries the engine's own
    label from ``meta_info["weight_versions"]`` (source ``engine``), and our record of the
    engine's versions follows the names."""
    from sglang.srt.managers.io_struct import (
        UpdateWeightFromDiskReqInput,
        UpdateWeightVersionReqInput,
    )

    manager = engine.tokenizer_manager
    activity = _telemetry(engine).engine_activity(adapter.model_name(manager))

    def generate(step: int, version: str) -> list[dict[str, Any]]:
        with rollout_step(step):
            outs = engine.generate([f"named {version} {i}" for i in range(3)], params(5))
        assert all(o["meta_info"]["weight_version"] == version for o in outs)  # SGLang's word
        return outs

    ok, *_ = engine.loop.run_until_complete(
        manager.update_weights_from_disk(
            UpdateWeightFromDiskReqInput(model_path=tiny_model, weight_version="w2"), None
        )
    )
    assert ok
    first = generate(41, "w2")
    assert activity.weights.current == "w2"
    engine.loop.run_until_complete(
        manager.update_weight_version(
            UpdateWeightVersionReqInput(new_version="w3", abort_all_requests=False)
        )
    )
    assert activity.weights.current == "w3"
    second = generate(42, "w3")

    spans = {
        s.attributes["gen_ai.response.id"]: s
        for s in otel.finished_spans()
        if s.attributes.get("gen_ai.response.id")
    }
    for outs, version in ((first, "w2"), (second, "w3")):
        for out in outs:
            meta = out["meta_info"]
            assert meta["weight_versions"] == [
                {"version": version, "start": 0, "end": meta["completion_tokens"]}
            ]
            a = spans[meta["id"]].attributes
            assert (a["rollout.weight.version"], a["rollout.weight.version_source"]) == (
                version,
                "engine",
            )
