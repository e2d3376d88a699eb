"""The OpenRLHF hook's own decisions, without OpenRLHF (its real rollout runs in
tests/openrlhf): the step read off the caller's ``global_step``, eval marked, a caller's step
kept, no step invented."""

from __future__ import annotations

from typing import Any

from otel_rollout import rollout_step
from otel_rollout.frameworks import openrlhf as hook
from tests.conftest import OTelHarness

generate = hook._rollout_wrapper(validate=False)
evaluate = hook._rollout_wrapper(validate=True)


def steps(otel: OTelHarness) -> list[Any]:
    return [s for s in otel.finished_spans() if s.name == "rollout.step"]


def fit_like(wrapper: Any, global_step: Any) -> Any:
    """Calls as ``PPOTrainer.fit`` does, with its local ``global_step``."""
    return wrapper(lambda: "samples", None, (), {})


def test_a_rollout_is_the_step_it_feeds_and_eval_the_step_it_evaluates(
    otel: OTelHarness,
) -> None:
    assert fit_like(generate, 4) == "samples"
    assert fit_like(evaluate, 4) == "samples"
    assert [
        (s.attributes["rollout.step"], s.attributes.get("rollout.step.validate"))
        for s in steps(otel)
    ] == [(5, None), (4, True)]


def test_no_global_step_no_step(otel: OTelHarness) -> None:
    assert generate(lambda: 1, None, (), {}) == 1  # this caller holds no global_step
    assert fit_like(generate, "3") == "samples"  # not a step number
    assert fit_like(generate, True) == "samples"
    assert steps(otel) == []


def test_a_callers_own_step_is_kept(otel: OTelHarness) -> None:
    with rollout_step(40):
        fit_like(generate, 4)
    assert [s.attributes["rollout.step"] for s in steps(otel)] == [40]
