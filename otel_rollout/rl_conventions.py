"""The proposed ``rl.*`` conventions, opt-in: our step and phases under the proposal's names.

OpenTelemetry has no conventions for RL training yet; ``rl.*`` is proposed in
open-telemetry/semantic-conventions-genai #88 (2026-03-26): ``rl.loop`` (the outer training
iteration), ``rl.sample`` (generation), ``rl.reward``, ``rl.train``, ``rl.sync`` (weight sync),
resource attributes ``rl.run.id``, ``rl.system``, ``rl.algorithm``, ``rl.model.name`` (and
environment and agent ones we have no figure for), metrics such as ``rl.loop.duration``. With
``OTEL_SEMCONV_STABILITY_OPT_IN`` holding ``rl_latest_experimental`` (a token of its own, read
as the GenAI one is) the step span is ``rl.loop``, the phases the proposal names get its span
names, and ``rl.loop.duration`` is recorded; our own names stay the default, and every
``rollout.*`` attribute stays on the spans (dashboards and the step's analytics read them).

Where we differ: the proposal puts run, system, algorithm and model on the *resource*; a
resource is fixed when the SDK starts, before the framework's step tells us its algorithm or
the engine its model, so they go on the ``rl.loop`` span (``rl.run.id`` can also be put on the
resource by the user: ``OTEL_RESOURCE_ATTRIBUTES=rl.run.id=…``). Pure functions of names and
attributes, no SDK.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from otel_rollout.semconv import (
    RL_ALGORITHM,
    RL_REWARD_SPAN_NAME,
    RL_RUN_ID,
    RL_SAMPLE_SPAN_NAME,
    RL_SYNC_SPAN_NAME,
    RL_SYSTEM,
    RL_TRAIN_SPAN_NAME,
    STEP_ALGORITHM,
    STEP_FRAMEWORK,
)

__all__ = ["PHASE_SPANS", "loop_attributes", "phase_span_name"]

PHASE_SPANS = {
    "generation": RL_SAMPLE_SPAN_NAME,
    "reward": RL_REWARD_SPAN_NAME,
    "actor_update": RL_TRAIN_SPAN_NAME,
    "critic_update": RL_TRAIN_SPAN_NAME,
    "weight_sync": RL_SYNC_SPAN_NAME,
}
"""Our shared phase vocabulary (:mod:`otel_rollout.phases`; verl's, TRL's timers map into it)
→ the proposal's span names. The phases it has no name for (log-probs, reference, advantage,
checkpoint, validation, a reward function's own) keep ours."""


def phase_span_name(phase: str) -> str | None:
    """The proposal's span name for phase ``phase``, or ``None`` where it has none."""
    return PHASE_SPANS.get(phase)


def loop_attributes(step_attributes: Mapping[str, Any], run_id: str | None) -> dict[str, Any]:
    """The proposal's attributes a step knows as it opens: the run, the framework (``rl.system``)
    and its algorithm, from the step's own attributes."""
    out: dict[str, Any] = {}
    if run_id:
        out[RL_RUN_ID] = run_id
    for ours, theirs in ((STEP_FRAMEWORK, RL_SYSTEM), (STEP_ALGORITHM, RL_ALGORITHM)):
        value = step_attributes.get(ours)
        if value is not None:
            out[theirs] = value
    return out
