"""Pure attribute builders: a request record or a step's figures → span and metric attributes.

No tracer, meter or context here (the step number is passed in), so what a span or a point will
carry can be unit-tested from hand-built records. :mod:`otel_rollout.telemetry` calls these and
does the emitting.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping
from typing import TYPE_CHECKING, Any

from opentelemetry.semconv._incubating.attributes import gen_ai_attributes as GenAI
from opentelemetry.semconv.attributes import error_attributes

from otel_rollout.figures import STEP_FIGURES
from otel_rollout.semconv import (
    GEN_AI_TOKEN_MODALITY,
    GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS,
    ROLLOUT_CACHED_TOKENS,
    ROLLOUT_DECODE_TIME,
    ROLLOUT_FINISH_REASON,
    ROLLOUT_PREEMPTIONS,
    ROLLOUT_PREFILL_TIME,
    ROLLOUT_QUEUE_TIME,
    ROLLOUT_REPLICA,
    ROLLOUT_SAMPLING_REASON,
    ROLLOUT_SPEC_ACCEPTED_TOKENS,
    ROLLOUT_SPEC_DRAFT_TOKENS,
    ROLLOUT_STEP,
    ROLLOUT_TIMING_SOURCE,
    ROLLOUT_TTFT,
    ROLLOUT_WEIGHT_VERSION,
    ROLLOUT_WEIGHT_VERSION_SOURCE,
    ROLLOUT_WEIGHT_VERSION_TOKENS,
    ROLLOUT_WEIGHT_VERSIONS,
    STEP_ATTR_CAUSE_PREFIX,
    STEP_ATTR_CAUSE_SUFFIX,
    STEP_ATTR_PHASE_PREFIX,
    STEP_ATTR_PHASE_SUFFIX,
    STEP_ATTR_SLOWEST_TRAJECTORIES,
    STEP_ATTR_UNACCOUNTED,
    STEP_ATTR_WHATIF_PREFIX,
    STEP_CAUSE_DOMINANT,
    TRAJECTORY_ADVANTAGE,
    TRAJECTORY_GENERATION_S,
    TRAJECTORY_OUTPUT_TOKENS,
    TRAJECTORY_REWARD,
    TRAJECTORY_SCORING_S,
    TRAJECTORY_STATUS,
    TRAJECTORY_TOOL_CALLS,
    TRAJECTORY_TOOL_S,
    TRAJECTORY_TURN_TIMING,
    TRAJECTORY_TURNS,
    TRAJECTORY_WAITING_S,
)

if TYPE_CHECKING:
    from otel_rollout.analysis import StepStats
    from otel_rollout.record import RequestRecord, TrajectoryRecord
    from otel_rollout.whatif import WhatIf

ERROR_MESSAGE_MAX = 256
"""Characters of an exception's message kept in a span's status description."""


def describe_error(error: BaseException) -> str:
    """How every span of ours describes a failure: ``Type: message`` (message cut short)."""
    text = str(error)
    name = type(error).__qualname__
    return f"{name}: {text[:ERROR_MESSAGE_MAX]}" if text else name


def engine_attributes(provider: str, model: str) -> dict[str, str]:
    """The labels of per-engine figures (in-flight time, step metrics)."""
    return {GenAI.GEN_AI_PROVIDER_NAME: provider, GenAI.GEN_AI_REQUEST_MODEL: model}


def base_attributes(provider: str, model: str, operation: str) -> dict[str, str]:
    """The labels every request figure and the batch span carry."""
    return {
        GenAI.GEN_AI_PROVIDER_NAME: provider,
        GenAI.GEN_AI_REQUEST_MODEL: model,
        GenAI.GEN_AI_OPERATION_NAME: operation,
    }


def metric_attribute_sets(
    provider: str, record: RequestRecord, gen_ai_latest: bool = False
) -> tuple[dict[str, str], dict[str, str], dict[str, str]]:
    """A request's metric labels: (all figures, input tokens, output tokens). Bounded: model,
    operation, finish reason and error type — never a request id or prompt text.

    The token sets add ``gen_ai.token.type`` (the default conventions' one token histogram), or
    with ``gen_ai_latest`` the usage counters' ``gen_ai.token.modality``: ``unknown`` for input
    (the engines do not split a multimodal prompt's count), ``text`` for output."""
    attrs = base_attributes(provider, record.model, record.operation)
    reason = record.finish_reason
    if reason is not None:
        attrs[ROLLOUT_FINISH_REASON] = reason
    if record.error is not None:
        attrs[error_attributes.ERROR_TYPE] = type(record.error).__qualname__
    if gen_ai_latest:
        return (
            attrs,
            {**attrs, GEN_AI_TOKEN_MODALITY: "unknown"},
            {**attrs, GEN_AI_TOKEN_MODALITY: "text"},
        )
    return (
        attrs,
        {**attrs, GenAI.GEN_AI_TOKEN_TYPE: "input"},
        {**attrs, GenAI.GEN_AI_TOKEN_TYPE: "output"},
    )


_OPTIONAL_KEYS = (
    GenAI.GEN_AI_RESPONSE_ID,
    GenAI.GEN_AI_REQUEST_MAX_TOKENS,
    GenAI.GEN_AI_REQUEST_TEMPERATURE,
    GenAI.GEN_AI_REQUEST_TOP_P,
    GenAI.GEN_AI_REQUEST_CHOICE_COUNT,
    GenAI.GEN_AI_USAGE_INPUT_TOKENS,
    GenAI.GEN_AI_USAGE_OUTPUT_TOKENS,
    ROLLOUT_CACHED_TOKENS,
    ROLLOUT_PREEMPTIONS,
    ROLLOUT_SPEC_DRAFT_TOKENS,
    ROLLOUT_SPEC_ACCEPTED_TOKENS,
    ROLLOUT_SAMPLING_REASON,
    ROLLOUT_QUEUE_TIME,
    ROLLOUT_TTFT,
    ROLLOUT_PREFILL_TIME,
    ROLLOUT_DECODE_TIME,
    ROLLOUT_STEP,
    ROLLOUT_WEIGHT_VERSION,
    ROLLOUT_WEIGHT_VERSION_SOURCE,
    ROLLOUT_REPLICA,
)
"""A request span's optional attributes, each set where the record has a value; in the order of
:func:`request_span_attributes`' values (built once here: the span of every request reads it)."""
_LATEST_KEYS = tuple(
    GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS if key == ROLLOUT_CACHED_TOKENS else key
    for key in _OPTIONAL_KEYS
)
"""The same with ``gen_ai_latest_experimental``: the cached tokens under their GenAI name."""


def request_span_attributes(
    record: RequestRecord,
    capture_content: bool,
    content_max_length: int,
    gen_ai_latest: bool = False,
) -> dict[str, Any]:
    """A request span's attributes (docs/EMITS.md's request-span table); content only on opt-in.
    With ``gen_ai_latest`` the cached prompt tokens are ``gen_ai.usage.cache_read.input_tokens``
    (the GenAI name), else ``rollout.usage.cached_tokens`` as before."""
    attrs: dict[str, Any] = {
        GenAI.GEN_AI_OPERATION_NAME: record.operation,
        GenAI.GEN_AI_PROVIDER_NAME: record.provider,
        GenAI.GEN_AI_REQUEST_MODEL: record.model,
        ROLLOUT_TIMING_SOURCE: record.timing_source,
    }
    values = (
        record.request_id,
        record.max_tokens,
        record.temperature,
        record.top_p,
        record.n,
        record.prompt_tokens,
        record.output_tokens,
        record.cached_tokens,
        record.preemptions,
        record.spec_draft_tokens,
        record.spec_accepted_tokens,
        None if record.kept == "all" else record.kept,
        record.queue_time_s,
        record.ttft_s,
        record.prefill_time_s,
        record.decode_time_s,
        record.step,
        record.weight_version,
        record.weight_version_source,
        record.replica,
    )
    for key, value in zip(_LATEST_KEYS if gen_ai_latest else _OPTIONAL_KEYS, values, strict=True):
        if value is not None:
            attrs[key] = value
    if record.finish_reasons:
        attrs[GenAI.GEN_AI_RESPONSE_FINISH_REASONS] = list(record.finish_reasons)
    if len(record.weight_versions) > 1:  # generated under several weights: which, how much
        attrs[ROLLOUT_WEIGHT_VERSIONS] = [v for v, _ in record.weight_versions]
        attrs[ROLLOUT_WEIGHT_VERSION_TOKENS] = [n for _, n in record.weight_versions]
    if record.error is not None:
        attrs[error_attributes.ERROR_TYPE] = type(record.error).__qualname__
    if capture_content:
        attrs.update(content_attributes(record, content_max_length))
    return attrs


def content_attributes(record: RequestRecord, limit: int) -> dict[str, str]:
    """Prompt and response text as GenAI messages, each text cut to ``limit`` characters."""
    attrs: dict[str, str] = {}
    if record.prompt_text is not None:
        attrs[GenAI.GEN_AI_INPUT_MESSAGES] = json.dumps(
            [{"role": "user", "parts": [{"type": "text", "content": record.prompt_text[:limit]}]}]
        )
    if record.completion_texts:
        reasons = record.finish_reasons
        attrs[GenAI.GEN_AI_OUTPUT_MESSAGES] = json.dumps(
            [
                {
                    "role": "assistant",
                    "parts": [{"type": "text", "content": text[:limit]}],
                    "finish_reason": reasons[i] if i < len(reasons) else "",
                }
                for i, text in enumerate(record.completion_texts)
            ]
        )
    return attrs


def step_span_attributes(stats: StepStats) -> dict[str, Any]:
    """The step span's analytics attributes (names in docs/EMITS.md's step-span table), one per
    figure of :data:`otel_rollout.figures.STEP_FIGURES` that has a span attribute and a value, and
    the span ids of the slowest trajectories when the step had some."""
    attrs: dict[str, Any] = {}
    for figure in STEP_FIGURES:
        if figure.span_attribute is not None and (value := figure.value(stats)) is not None:
            attrs[figure.span_attribute] = value
    if stats.trajectories is not None and stats.trajectories.slowest_span_ids:
        attrs[STEP_ATTR_SLOWEST_TRAJECTORIES] = stats.trajectories.slowest_span_ids
    if stats.causes is not None:
        for cause, seconds in stats.causes.seconds.items():
            if seconds > 0:
                attrs[f"{STEP_ATTR_CAUSE_PREFIX}{cause}{STEP_ATTR_CAUSE_SUFFIX}"] = round(
                    seconds, 6
                )
        attrs[STEP_CAUSE_DOMINANT] = stats.causes.dominant
    if stats.whatif is not None:
        attrs.update(whatif_attributes(stats.whatif))
    return attrs


def whatif_attributes(estimate: WhatIf) -> dict[str, Any]:
    """``rollout.step.whatif.<change>.<figure>``: ``cap_p95.saved_s``, ``stop_90.lost``, …"""
    attrs: dict[str, Any] = {
        f"{STEP_ATTR_WHATIF_PREFIX}{name}.saved_s": round(saved, 6)
        for name, saved in estimate.savings()
    }
    for cap in estimate.caps:
        attrs[f"{STEP_ATTR_WHATIF_PREFIX}{cap.name}.tokens"] = cap.tokens
        attrs[f"{STEP_ATTR_WHATIF_PREFIX}{cap.name}.truncated"] = cap.truncated
    for stop in estimate.stops:
        attrs[f"{STEP_ATTR_WHATIF_PREFIX}{stop.name}.lost"] = stop.lost
    if estimate.balance is not None:
        attrs[STEP_ATTR_WHATIF_PREFIX + "fewest_replicas.replicas"] = estimate.balance.fewest
    return attrs


def trajectory_span_attributes(
    trajectory: TrajectoryRecord, turn_timing: Collection[str] = ()
) -> dict[str, Any]:
    """An ended trajectory's figures on its span (docs/EMITS.md's trajectory table);
    ``turn_timing``: whose clocks timed its turns (``rollout.trajectory.turn_timing``, ``mixed``
    for several)."""
    attrs: dict[str, Any] = {
        TRAJECTORY_TURNS: len(trajectory.turns),
        TRAJECTORY_OUTPUT_TOKENS: trajectory.output_tokens,
        TRAJECTORY_GENERATION_S: round(trajectory.generation_s, 6),
        TRAJECTORY_TOOL_S: round(trajectory.tool_s, 6),
        TRAJECTORY_TOOL_CALLS: len(trajectory.tools),
        TRAJECTORY_SCORING_S: round(trajectory.scoring_s, 6),
        TRAJECTORY_WAITING_S: round(trajectory.waiting_s, 6),
        TRAJECTORY_STATUS: trajectory.status,
    }
    if turn_timing:
        attrs[TRAJECTORY_TURN_TIMING] = (
            next(iter(turn_timing)) if len(turn_timing) == 1 else "mixed"
        )
    if trajectory.reward is not None:
        attrs[TRAJECTORY_REWARD] = trajectory.reward
    if trajectory.advantage is not None:
        attrs[TRAJECTORY_ADVANTAGE] = trajectory.advantage
    return attrs


def step_phase_attributes(phases: Mapping[str, float], duration_s: float) -> dict[str, float]:
    """Each top-level phase's total seconds in the step, and the seconds none of them covered.

    ``phases`` are totals per name (a name timed twice in one step is summed, as verl's own
    ``timing_raw`` does); nothing is reported for a step without phases.
    """
    if not phases:
        return {}
    attrs = {
        f"{STEP_ATTR_PHASE_PREFIX}{name}{STEP_ATTR_PHASE_SUFFIX}": round(seconds, 6)
        for name, seconds in phases.items()
    }
    attrs[STEP_ATTR_UNACCOUNTED] = round(max(0.0, duration_s - sum(phases.values())), 6)
    return attrs
