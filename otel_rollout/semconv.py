"""Names otel_rollout emits that the OpenTelemetry semantic conventions do not (yet) define.

GenAI names come from ``opentelemetry.semconv`` wherever a constant exists; this module holds
only our own ``rollout.*`` names, so a dashboard or a rule can be checked against one list.
"""

from __future__ import annotations

# --- request-level attributes -------------------------------------------------------------
ROLLOUT_FINISH_REASON = "rollout.finish_reason"
"""One normalised finish reason per request on metrics (bounded: stop, length, abort, error)."""
ROLLOUT_QUEUE_TIME = "rollout.request.queue_time"
ROLLOUT_TTFT = "rollout.request.time_to_first_token"
ROLLOUT_CACHED_TOKENS = "rollout.usage.cached_tokens"
ROLLOUT_TIMING_SOURCE = "rollout.timing.source"
"""Where the span's timestamps came from: ``engine``, ``engine_steps``, ``engine_latency``, ``observed`` (README)."""
ROLLOUT_BATCH_SIZE = "rollout.batch.size"
ROLLOUT_STEP = "rollout.step"

# --- request-level metrics (besides the GenAI semconv ones) -----------------------------
METRIC_QUEUE_TIME = "rollout.request.queue_time"
METRIC_ACTIVE = "rollout.requests.active"

# --- step analytics ----------------------------------------------------------------------
METRIC_STEP_DURATION = "rollout.step.duration"
METRIC_STEP_TAIL_DURATION = "rollout.step.tail.duration"
METRIC_STEP_TAIL_REQUESTS = "rollout.step.tail.requests"
METRIC_STEP_STRAGGLER_RATIO = "rollout.step.straggler_ratio"
METRIC_STEP_OUTPUT_TOKENS = "rollout.step.output_tokens"
METRIC_STEP_TRUNCATION_RATIO = "rollout.step.truncation_ratio"
METRIC_STEP_IDLE_CAPACITY = "rollout.step.idle_capacity"
METRIC_STEP_IDLE_FRACTION = "rollout.step.idle_fraction"
METRIC_STEP_REQUESTS = "rollout.step.requests"
METRIC_ENGINE_BUSY_TIME = "rollout.engine.busy_time"
METRIC_ENGINE_IDLE_TIME = "rollout.engine.idle_time"

ROLLOUT_STATISTIC = "rollout.statistic"
"""Which per-step statistic a ``rollout.step.output_tokens`` point is: ``max``, ``p50`` or ``p90``."""

# --- step span attributes ----------------------------------------------------------------
STEP_REQUESTS = "rollout.step.requests"
STEP_TAIL_DURATION = "rollout.step.tail.duration_s"
STEP_TAIL_REQUESTS = "rollout.step.tail.requests"
STEP_TAIL_FRACTION = "rollout.step.tail.fraction"
STEP_STRAGGLER_RATIO = "rollout.step.straggler_ratio"
STEP_OUTPUT_TOKENS_MAX = "rollout.step.output_tokens.max"
STEP_OUTPUT_TOKENS_P50 = "rollout.step.output_tokens.p50"
STEP_OUTPUT_TOKENS_P90 = "rollout.step.output_tokens.p90"
STEP_LATENCY_P50 = "rollout.step.latency.p50_s"
STEP_LATENCY_P90 = "rollout.step.latency.p90_s"
STEP_LATENCY_MAX = "rollout.step.latency.max_s"
STEP_TRUNCATION_RATIO = "rollout.step.truncation_ratio"
STEP_IDLE_CAPACITY = "rollout.step.idle_capacity_s"
STEP_IDLE_FRACTION = "rollout.step.idle_fraction"
STEP_PEAK_ACTIVE = "rollout.step.peak_active"

EVENT_FIRST_TOKEN = "gen_ai.first_token"
"""Span event at the engine's first output token; its timestamp is the engine's, not ours."""
