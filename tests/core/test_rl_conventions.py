"""OTEL_SEMCONV_STABILITY_OPT_IN=rl_latest_experimental: the step and its phases under the
proposed ``rl.*`` names (docs/EMITS.md), through the same code paths a framework hook takes —
and with the opt-in off, nothing of it.

The opt-in is read like the GenAI one (its own token in the standard list); a step is made by
slime's hook (a framework name and an algorithm it read), phases by ``rollout_phase`` with the
shared vocabulary's names. TRL's real trainer runs both ways in tests/trl.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from otel_rollout import rollout_phase
from otel_rollout.config import GEN_AI_LATEST, RL_LATEST, SEMCONV_OPT_IN_ENV, load_config
from otel_rollout.frameworks import slime
from otel_rollout.rl_conventions import PHASE_SPANS
from otel_rollout.telemetry import job_step_telemetry
from testkit.records import make_record
from tests.conftest import OTelHarness

generate = dict(slime.HOOKS)["generate"]
MANAGER = SimpleNamespace(args=SimpleNamespace(advantage_estimator="grpo"))


@pytest.mark.parametrize(
    "value, rl, gen_ai",
    [
        (None, False, False),
        (RL_LATEST, True, False),
        (f"{GEN_AI_LATEST},{RL_LATEST}", True, True),
        (f" http , {RL_LATEST} ", True, False),
        ("rl_latest", False, False),
        (GEN_AI_LATEST, False, True),
    ],
)
def test_the_opt_in_is_its_own_token_in_the_standard_list(
    value: str | None, rl: bool, gen_ai: bool
) -> None:
    config = load_config({} if value is None else {SEMCONV_OPT_IN_ENV: value})
    assert (config.rl_latest, config.gen_ai_latest) == (rl, gen_ai)


def rollout(step: int) -> None:
    """A slime rollout: one request served in the step, then the phases a loop times."""

    def body(rollout_id: int) -> None:
        from otel_rollout.context import current_step

        collector = current_step()
        assert collector is not None
        collector.observe(make_record(model="tiny-llama"))
        for name in ("generation", "reward", "actor_update", "weight_sync", "log_probs"):
            with rollout_phase(name):
                pass

    generate(body, MANAGER, (step,), {})


def by_name(otel: OTelHarness) -> dict[str, Any]:
    return {s.name: s for s in otel.finished_spans()}


@pytest.fixture
def opted_in(monkeypatch: pytest.MonkeyPatch) -> None:
    steps = job_step_telemetry()
    config = load_config({SEMCONV_OPT_IN_ENV: RL_LATEST, "OTEL_ROLLOUT_RUN_ID": "run-7"})
    monkeypatch.setattr(steps, "config", config)
    monkeypatch.setattr(steps, "_instruments", None)  # made again, under the opt-in's config


def test_under_the_opt_in_the_step_is_rl_loop_and_the_phases_the_proposals(
    otel: OTelHarness, opted_in: None
) -> None:
    rollout(3)
    spans = by_name(otel)
    loop = spans["rl.loop"]
    assert "rollout.step" not in spans
    assert {k: loop.attributes.get(k) for k in ("rl.run.id", "rl.system", "rl.algorithm")} == {
        "rl.run.id": "run-7",
        "rl.system": "slime",
        "rl.algorithm": "grpo",
    }
    assert loop.attributes["rl.model.name"] == "tiny-llama"
    # ours stay beside them: the analytics, sampling and dashboards read them
    assert loop.attributes["rollout.step"] == 3
    assert loop.attributes["rollout.step.requests"] == 1
    assert loop.attributes["rollout.step.framework"] == "slime"
    for phase, name in (
        ("generation", "rl.sample"),
        ("reward", "rl.reward"),
        ("actor_update", "rl.train"),
        ("weight_sync", "rl.sync"),
    ):
        assert PHASE_SPANS[phase] == name
        assert spans[name].attributes["rollout.phase.name"] == phase
        assert spans[name].parent.span_id == loop.context.span_id
    assert "rollout.phase log_probs" in spans  # the proposal has no name for it: ours
    [point] = otel.metric_points("rl.loop.duration")
    assert point.count == 1 and point.sum == pytest.approx(
        (loop.end_time - loop.start_time) / 1e9, abs=0.05
    )


def test_without_it_nothing_of_rl_is_emitted(otel: OTelHarness) -> None:
    rollout(4)
    spans = by_name(otel)
    step = spans["rollout.step"]
    assert not [k for s in spans.values() for k in s.attributes if k.startswith("rl.")]
    assert not [n for n in spans if n.startswith("rl.")]
    assert step.attributes["rollout.step.framework"] == "slime"
    assert step.attributes["rollout.step.algorithm"] == "grpo"
    assert otel.metric_points("rl.loop.duration") == []
