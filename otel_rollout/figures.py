"""Every per-step figure, declared once: what it is called on the step span and as a metric, its
unit, description and buckets.

A figure's value is a field of :class:`~otel_rollout.analysis.StepStats` (a pure function of the
step's records, in :mod:`otel_rollout.analysis`); everything else about it is one entry of
:data:`STEP_FIGURES`, from which the step span's attributes (:func:`otel_rollout.attributes.
step_span_attributes`) and the ``rollout.step.*`` histograms (:class:`otel_rollout.instruments.
StepInstruments`) are derived. Adding a per-step figure is a ``StepStats`` field, its function,
and one entry here (docs/ARCHITECTURE.md has the checklist).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from otel_rollout.config import DEFAULT_RATIO_BUCKETS, IDLE_CAPACITY_BUCKETS, RolloutConfig
from otel_rollout.semconv import (
    STEP_ATTR_CACHED_TOKENS,
    STEP_ATTR_DECODE_MAX,
    STEP_ATTR_DECODE_P90,
    STEP_ATTR_ENGINE_ABORTED,
    STEP_ATTR_ENGINE_GENERATION_TOKENS,
    STEP_ATTR_ENGINE_ITERATIONS,
    STEP_ATTR_ENGINE_KV_MEAN,
    STEP_ATTR_ENGINE_KV_PEAK,
    STEP_ATTR_ENGINE_PREEMPTIONS,
    STEP_ATTR_ENGINE_PREFIX_HIT_RATE,
    STEP_ATTR_ENGINE_PROMPT_TOKENS,
    STEP_ATTR_ENGINE_RUNNING_PEAK,
    STEP_ATTR_ENGINE_SOURCE,
    STEP_ATTR_ENGINE_SPEC_ACCEPTANCE_RATE,
    STEP_ATTR_ENGINE_SPEC_ACCEPTED_TOKENS,
    STEP_ATTR_ENGINE_SPEC_DRAFT_TOKENS,
    STEP_ATTR_ENGINE_THROUGHPUT,
    STEP_ATTR_ENGINE_WAITING_PEAK,
    STEP_ATTR_IDLE_CAPACITY,
    STEP_ATTR_LATENCY_MAX,
    STEP_ATTR_LATENCY_P50,
    STEP_ATTR_LATENCY_P90,
    STEP_ATTR_OUTPUT_TOKENS_MAX,
    STEP_ATTR_OUTPUT_TOKENS_P50,
    STEP_ATTR_OUTPUT_TOKENS_P90,
    STEP_ATTR_PEAK_ACTIVE,
    STEP_ATTR_PREEMPTIONS,
    STEP_ATTR_PREFILL_MAX,
    STEP_ATTR_PREFILL_P90,
    STEP_ATTR_QUEUE_MAX,
    STEP_ATTR_QUEUE_P90,
    STEP_ATTR_REPLICA_SPREAD,
    STEP_ATTR_REPLICAS,
    STEP_ATTR_STALE_REQUESTS,
    STEP_ATTR_STALENESS_MAX,
    STEP_ATTR_STALENESS_MEAN,
    STEP_ATTR_TAIL_DURATION,
    STEP_ATTR_TAIL_FRACTION,
    STEP_ATTR_TRAJECTORIES,
    STEP_ATTR_TRAJECTORY_DURATION_MAX,
    STEP_ATTR_TRAJECTORY_DURATION_P50,
    STEP_ATTR_TRAJECTORY_DURATION_P90,
    STEP_ATTR_TRAJECTORY_TURNS_MAX,
    STEP_ATTR_TRAJECTORY_TURNS_P50,
    STEP_ATTR_WEIGHT_VERSION,
    STEP_CACHE_HIT_RATE,
    STEP_DECODE_TIME,
    STEP_DURATION,
    STEP_ENGINE_KV_CACHE_USAGE,
    STEP_IDLE_CAPACITY,
    STEP_IDLE_FRACTION,
    STEP_OUTPUT_TOKENS,
    STEP_PREFILL_TIME,
    STEP_QUEUE_TIME,
    STEP_REPLICA_SPREAD,
    STEP_REQUESTS,
    STEP_STALENESS,
    STEP_STRAGGLER_RATIO,
    STEP_TAIL_DURATION,
    STEP_TAIL_REQUESTS,
    STEP_TOOL_SHARE,
    STEP_TRUNCATION_RATIO,
)

if TYPE_CHECKING:
    from otel_rollout.analysis import StepStats

FRACTION_BUCKETS = (0.01, 0.02, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)
STALENESS_BUCKETS = (0, 1, 2, 3, 4, 6, 8, 12, 16, 32, 64)
"""Weight versions behind: off-policy RL keeps it at a handful (AReaL's default bound is 4)."""
COUNT_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 65536)
PREEMPTION_BUCKETS = (0, *COUNT_BUCKETS)
"""Most steps see none: 0 is a bucket of its own."""


@dataclass(frozen=True)
class StepFigure:
    field: str
    """The :class:`~otel_rollout.analysis.StepStats` attribute holding the value (dotted for a
    part of it that a step may lack: ``trajectories.tool_share``)."""
    span_attribute: str | None = None
    """Its name on the step span; ``None`` when the span says it otherwise (its own duration)."""
    metric: str | None = None
    """The ``rollout.step.*`` histogram it is recorded into, one point per step; ``None``: span only."""
    unit: str = ""
    description: str = ""
    buckets: str | Sequence[float] = ()
    """Explicit bucket advice: boundaries, or the name of the :class:`RolloutConfig` setting."""
    statistic: str | None = None
    """For figures sharing one metric: their ``rollout.statistic`` label (``max``, ``p50``, …)."""

    def value(self, stats: StepStats) -> float | int | None:
        """The figure's value in ``stats``; ``None`` where the step has none (a dotted field in a
        part the step lacks: ``trajectories.count`` of a step without trajectories)."""
        value: Any = stats
        for part in self.field.split("."):
            value = getattr(value, part)
            if value is None:
                return None
        return value  # type: ignore[no-any-return]

    def boundaries(self, config: RolloutConfig) -> Sequence[float]:
        return getattr(config, self.buckets) if isinstance(self.buckets, str) else self.buckets


_TOKENS = "Per-step response length statistics."
_PHASE = "Per-step {} of the step's requests (p90, max) as the engine stamped them."
_KV = "Per-step KV-cache usage as the engine reported it each iteration (peak, mean)."
_STALENESS = (
    "Per-step weight-version staleness: the step's weight version minus the version that "
    "generated each request."
)

STEP_FIGURES: tuple[StepFigure, ...] = (
    StepFigure(
        "duration_s",
        metric=STEP_DURATION,
        unit="s",
        description="Wall time of a training step's scope.",
        buckets="latency_buckets",
    ),
    StepFigure(
        "requests",
        metric=STEP_REQUESTS,
        unit="{request}",
        description="Requests in the step.",
        buckets=COUNT_BUCKETS,
    ),
    StepFigure(
        "tail_duration_s",
        STEP_ATTR_TAIL_DURATION,
        STEP_TAIL_DURATION,
        "s",
        "Time from the tail quantile of finishes to the last finish.",
        "latency_buckets",
    ),
    StepFigure(
        "tail_requests",
        STEP_TAIL_REQUESTS,
        STEP_TAIL_REQUESTS,
        "{request}",
        "Requests still running when the tail began.",
        COUNT_BUCKETS,
    ),
    StepFigure("tail_fraction", STEP_ATTR_TAIL_FRACTION),
    StepFigure(
        "straggler_ratio",
        STEP_STRAGGLER_RATIO,
        STEP_STRAGGLER_RATIO,
        "1",
        "Slowest request latency over the median.",
        DEFAULT_RATIO_BUCKETS,
    ),
    StepFigure("latency_p50_s", STEP_ATTR_LATENCY_P50),
    StepFigure("latency_p90_s", STEP_ATTR_LATENCY_P90),
    StepFigure("latency_max_s", STEP_ATTR_LATENCY_MAX),
    StepFigure(
        "output_tokens_p50",
        STEP_ATTR_OUTPUT_TOKENS_P50,
        STEP_OUTPUT_TOKENS,
        "{token}",
        _TOKENS,
        "token_buckets",
        "p50",
    ),
    StepFigure(
        "output_tokens_p90",
        STEP_ATTR_OUTPUT_TOKENS_P90,
        STEP_OUTPUT_TOKENS,
        "{token}",
        _TOKENS,
        "token_buckets",
        "p90",
    ),
    StepFigure(
        "output_tokens_max",
        STEP_ATTR_OUTPUT_TOKENS_MAX,
        STEP_OUTPUT_TOKENS,
        "{token}",
        _TOKENS,
        "token_buckets",
        "max",
    ),
    StepFigure(
        "truncation_ratio",
        STEP_TRUNCATION_RATIO,
        STEP_TRUNCATION_RATIO,
        "1",
        "Share of requests that stopped at max_tokens.",
        FRACTION_BUCKETS,
    ),
    StepFigure(
        "idle_capacity_s",
        STEP_ATTR_IDLE_CAPACITY,
        STEP_IDLE_CAPACITY,
        "s",
        "Request-seconds of in-flight capacity left unused during the rollout window.",
        IDLE_CAPACITY_BUCKETS,
    ),
    StepFigure(
        "idle_fraction",
        STEP_IDLE_FRACTION,
        STEP_IDLE_FRACTION,
        "1",
        "Idle capacity as a share of peak in-flight × window.",
        FRACTION_BUCKETS,
    ),
    StepFigure("peak_active", STEP_ATTR_PEAK_ACTIVE),
    # how the work spread over replicas (absent from a step served by one)
    StepFigure("replicas.count", STEP_ATTR_REPLICAS),
    StepFigure(
        "replicas.spread_s",
        STEP_ATTR_REPLICA_SPREAD,
        STEP_REPLICA_SPREAD,
        "s",
        "The latest replica's last finish minus the earliest's, per step with several replicas.",
        "latency_buckets",
    ),
    StepFigure(
        "preemptions",
        STEP_ATTR_PREEMPTIONS,
        STEP_ATTR_PREEMPTIONS,
        "{preemption}",
        "Preemptions of the step's requests, as the engine counted them per request.",
        PREEMPTION_BUCKETS,
    ),
    # a step's agentic trajectories (absent from a step without them)
    StepFigure("trajectories.count", STEP_ATTR_TRAJECTORIES),
    StepFigure("trajectories.turns_p50", STEP_ATTR_TRAJECTORY_TURNS_P50),
    StepFigure("trajectories.turns_max", STEP_ATTR_TRAJECTORY_TURNS_MAX),
    StepFigure("trajectories.duration_p50_s", STEP_ATTR_TRAJECTORY_DURATION_P50),
    StepFigure("trajectories.duration_p90_s", STEP_ATTR_TRAJECTORY_DURATION_P90),
    StepFigure("trajectories.duration_max_s", STEP_ATTR_TRAJECTORY_DURATION_MAX),
    StepFigure(
        "trajectories.tool_share",
        STEP_TOOL_SHARE,
        STEP_TOOL_SHARE,
        "1",
        "Share of the step's trajectory time spent in tool calls.",
        FRACTION_BUCKETS,
    ),
    # weight-version staleness (absent from a step whose requests carry no version)
    StepFigure("staleness.current", STEP_ATTR_WEIGHT_VERSION),
    StepFigure(
        "staleness.max",
        STEP_ATTR_STALENESS_MAX,
        STEP_STALENESS,
        "{version}",
        _STALENESS,
        STALENESS_BUCKETS,
        "max",
    ),
    StepFigure(
        "staleness.mean",
        STEP_ATTR_STALENESS_MEAN,
        STEP_STALENESS,
        "{version}",
        _STALENESS,
        STALENESS_BUCKETS,
        "mean",
    ),
    StepFigure("staleness.stale_requests", STEP_ATTR_STALE_REQUESTS),
    # inside the engine (absent where the engine does not stamp or count them)
    StepFigure(
        "request_phases.queue.p90_s",
        STEP_ATTR_QUEUE_P90,
        STEP_QUEUE_TIME,
        "s",
        _PHASE.format("queue time (arrival → scheduled)"),
        "latency_buckets",
        "p90",
    ),
    StepFigure(
        "request_phases.queue.max_s",
        STEP_ATTR_QUEUE_MAX,
        STEP_QUEUE_TIME,
        "s",
        _PHASE.format("queue time (arrival → scheduled)"),
        "latency_buckets",
        "max",
    ),
    StepFigure(
        "request_phases.prefill.p90_s",
        STEP_ATTR_PREFILL_P90,
        STEP_PREFILL_TIME,
        "s",
        _PHASE.format("prefill time (scheduled → first token)"),
        "latency_buckets",
        "p90",
    ),
    StepFigure(
        "request_phases.prefill.max_s",
        STEP_ATTR_PREFILL_MAX,
        STEP_PREFILL_TIME,
        "s",
        _PHASE.format("prefill time (scheduled → first token)"),
        "latency_buckets",
        "max",
    ),
    StepFigure(
        "request_phases.decode.p90_s",
        STEP_ATTR_DECODE_P90,
        STEP_DECODE_TIME,
        "s",
        _PHASE.format("decode time (first token → finish)"),
        "latency_buckets",
        "p90",
    ),
    StepFigure(
        "request_phases.decode.max_s",
        STEP_ATTR_DECODE_MAX,
        STEP_DECODE_TIME,
        "s",
        _PHASE.format("decode time (first token → finish)"),
        "latency_buckets",
        "max",
    ),
    StepFigure(
        "cache.hit_rate",
        STEP_CACHE_HIT_RATE,
        STEP_CACHE_HIT_RATE,
        "1",
        "Share of the step's prompt tokens the engine found in its prefix cache.",
        FRACTION_BUCKETS,
    ),
    StepFigure("cache.cached_tokens", STEP_ATTR_CACHED_TOKENS),
    # the engine's own per-iteration figures (absent where no engine stat hook reported)
    StepFigure("engine.iterations", STEP_ATTR_ENGINE_ITERATIONS),
    StepFigure(
        "engine.kv_cache_usage_peak",
        STEP_ATTR_ENGINE_KV_PEAK,
        STEP_ENGINE_KV_CACHE_USAGE,
        "1",
        _KV,
        FRACTION_BUCKETS,
        "peak",
    ),
    StepFigure(
        "engine.kv_cache_usage_mean",
        STEP_ATTR_ENGINE_KV_MEAN,
        STEP_ENGINE_KV_CACHE_USAGE,
        "1",
        _KV,
        FRACTION_BUCKETS,
        "mean",
    ),
    StepFigure("engine.running_peak", STEP_ATTR_ENGINE_RUNNING_PEAK),
    StepFigure("engine.waiting_peak", STEP_ATTR_ENGINE_WAITING_PEAK),
    StepFigure("engine.prompt_tokens", STEP_ATTR_ENGINE_PROMPT_TOKENS),
    StepFigure("engine.generation_tokens", STEP_ATTR_ENGINE_GENERATION_TOKENS),
    StepFigure("engine.generation_throughput", STEP_ATTR_ENGINE_THROUGHPUT),
    StepFigure("engine.preemptions", STEP_ATTR_ENGINE_PREEMPTIONS),
    StepFigure("engine.prefix_cache_hit_rate", STEP_ATTR_ENGINE_PREFIX_HIT_RATE),
    StepFigure("engine.aborted", STEP_ATTR_ENGINE_ABORTED),
    StepFigure("engine.spec_draft_tokens", STEP_ATTR_ENGINE_SPEC_DRAFT_TOKENS),
    StepFigure("engine.spec_accepted_tokens", STEP_ATTR_ENGINE_SPEC_ACCEPTED_TOKENS),
    StepFigure("engine.spec_acceptance_rate", STEP_ATTR_ENGINE_SPEC_ACCEPTANCE_RATE),
    StepFigure("engine.source", STEP_ATTR_ENGINE_SOURCE),
)
"""In the step span's attribute order (docs/EMITS.md's step-span table)."""


def step_metrics() -> dict[str, StepFigure]:
    """One figure per ``rollout.step.*`` histogram (the first, for a shared one): its unit,
    description and buckets. Figures sharing a metric must agree on those (tested)."""
    out: dict[str, StepFigure] = {}
    for figure in STEP_FIGURES:
        if figure.metric is not None:
            out.setdefault(figure.metric, figure)
    return out
