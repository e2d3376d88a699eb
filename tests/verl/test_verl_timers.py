"""verl's own ``marked_timer`` as the step and its phases (issue #28), on verl's real timer.

The trainer end to end is test_verl_trainer.py (minutes); these pin the hook's contract in
seconds: verl's ``timing_raw`` is filled exactly as without us, the ``step`` timer opened by a
trainer method becomes ``rollout_step(self.global_steps)``, the timers inside it phases whose
durations are what verl recorded, and verl's exceptions pass through.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
import wrapt

from otel_rollout import current_step
from otel_rollout.frameworks import verl as hook
from tests.conftest import OTelHarness

pytestmark = pytest.mark.verl


class VerlError(RuntimeError):
    pass


@pytest.fixture(scope="module")
def timer(verl_module: Any) -> Any:
    """verl's real ``marked_timer``, wrapped as ``VerlInstrumentor`` wraps it."""
    from verl.utils.profiler.performance import marked_timer

    return wrapt.FunctionWrapper(marked_timer, hook.marked_timer_wrapper)


class Trainer:
    """Shaped like verl's ``fit``: ``self.global_steps``, one ``step`` timer, phases inside."""

    def __init__(self, timer: Any, global_steps: int) -> None:
        self.timer = timer
        self.global_steps = global_steps
        self.seen_step: int | None = None

    def fit_one(self, timing_raw: dict[str, float], fail_in: str = "") -> None:
        marked_timer = self.timer
        with marked_timer("step", timing_raw):
            step = current_step()
            self.seen_step = step.step if step is not None else None
            with marked_timer("gen", timing_raw, color="red"):
                time.sleep(0.03)
            for _ in range(2):  # verl sums a timer used twice in a step
                with marked_timer("reward", timing_raw, color="yellow"):
                    time.sleep(0.01)
            with marked_timer("update_actor", timing_raw, color="red"):
                if fail_in == "update_actor":
                    raise VerlError("verl's own")
                time.sleep(0.02)
            time.sleep(0.02)  # outside every phase


def test_step_timer_is_the_step_and_the_others_its_phases(otel: OTelHarness, timer: Any) -> None:
    trainer = Trainer(timer, global_steps=4)
    timing_raw: dict[str, float] = {}
    trainer.fit_one(timing_raw)
    assert set(timing_raw) == {"step", "gen", "reward", "update_actor"}  # verl's, untouched
    assert trainer.seen_step == 4
    spans = otel.finished_spans()
    (step,) = [s for s in spans if s.name == "rollout.step"]
    assert step.attributes["rollout.step"] == 4
    phases = [s for s in spans if s.name.startswith("rollout.phase ")]
    assert all(p.parent.span_id == step.context.span_id for p in phases)
    by_verl: dict[str, float] = {}
    for phase in phases:
        assert phase.attributes["rollout.phase.framework"] == "verl"
        name = phase.attributes["rollout.phase.framework_name"]
        by_verl[name] = by_verl.get(name, 0.0) + (phase.end_time - phase.start_time) / 1e9
    assert {p.attributes["rollout.phase.name"] for p in phases} == {
        "generation",
        "reward",
        "actor_update",
    }
    for name, seconds in by_verl.items():
        assert seconds == pytest.approx(timing_raw[name], abs=0.002), name
    attrs = step.attributes
    assert attrs["rollout.step.phase.reward.duration_s"] == pytest.approx(
        timing_raw["reward"], abs=0.002
    )
    assert (step.end_time - step.start_time) / 1e9 == pytest.approx(timing_raw["step"], abs=0.002)
    covered = sum(v for k, v in timing_raw.items() if k != "step")
    assert attrs["rollout.step.unaccounted_s"] == pytest.approx(
        timing_raw["step"] - covered, abs=0.003
    )


def test_verls_exception_passes_through_the_step_and_the_phase(
    otel: OTelHarness, timer: Any
) -> None:
    trainer = Trainer(timer, global_steps=9)
    with pytest.raises(VerlError, match="verl's own"):
        trainer.fit_one({}, fail_in="update_actor")
    spans = {s.name: s for s in otel.finished_spans()}
    assert spans["rollout.phase actor_update"].attributes["error.type"] == "VerlError"
    assert spans["rollout.step"].attributes["error.type"] == "VerlError"


def test_timers_outside_a_step_and_steps_without_a_trainer_are_verls_alone(
    otel: OTelHarness, timer: Any
) -> None:
    timing_raw: dict[str, float] = {}
    with timer("start_profile", timing_raw):  # verl times this before its step timer
        pass
    with timer("step", timing_raw):  # not opened by an object with global_steps
        assert current_step() is None
    assert set(timing_raw) == {"start_profile", "step"}
    assert otel.finished_spans() == []


def test_instrumentor_patches_the_timer_where_trainers_import_it(verl_module: Any) -> None:
    import verl.utils.debug
    import verl.utils.profiler

    instrumentor = hook.VerlInstrumentor()
    before = verl.utils.profiler.marked_timer, verl.utils.debug.marked_timer
    instrumentor.instrument()
    try:
        for module in (verl.utils.profiler, verl.utils.debug):
            patched = module.marked_timer
            assert isinstance(patched, wrapt.FunctionWrapper), module.__name__
        trainer = Trainer(verl.utils.debug.marked_timer, global_steps=2)
        timing_raw: dict[str, float] = {}
        trainer.fit_one(timing_raw)
        assert trainer.seen_step == 2
    finally:
        instrumentor.uninstrument()
    assert (verl.utils.profiler.marked_timer, verl.utils.debug.marked_timer) == before


def test_a_reexport_of_the_wrapped_timer_is_translated_once(otel: OTelHarness, timer: Any) -> None:
    """``verl.utils.debug`` star-imports ``verl.utils.profiler``'s timer after our hook wrapped
    it, and is then wrapped itself: the outer wrapper hands over to the inner one."""
    twice = wrapt.FunctionWrapper(timer, hook.marked_timer_wrapper)
    Trainer(twice, global_steps=3).fit_one({})
    names = [s.name for s in otel.finished_spans()]
    assert names.count("rollout.step") == 1 and names.count("rollout.phase generation") == 1
