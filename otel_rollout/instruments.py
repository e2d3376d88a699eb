"""The instruments otel_rollout records into: per request, and per step. Created once per meter
user (an engine's telemetry, the job's step telemetry), never per request or per step.

Names, units and bucket advice live here and in :mod:`otel_rollout.semconv`; what a point's
labels are is :mod:`otel_rollout.attributes`' business; when points are recorded is
:mod:`otel_rollout.telemetry`'s.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from opentelemetry import metrics
from opentelemetry.metrics import Meter
from opentelemetry.semconv._incubating.metrics import gen_ai_metrics

from otel_rollout.config import DEFAULT_RATIO_BUCKETS, IDLE_CAPACITY_BUCKETS, RolloutConfig
from otel_rollout.semconv import (
    METRIC_TELEMETRY_DROPPED,
    ROLLOUT_QUEUE_TIME,
    ROLLOUT_STATISTIC,
    STEP_DURATION,
    STEP_IDLE_CAPACITY,
    STEP_IDLE_FRACTION,
    STEP_OUTPUT_TOKENS,
    STEP_PHASE_DURATION,
    STEP_REQUESTS,
    STEP_STRAGGLER_RATIO,
    STEP_TAIL_DURATION,
    STEP_TAIL_REQUESTS,
    STEP_TRUNCATION_RATIO,
)

if TYPE_CHECKING:
    from opentelemetry.context import Context

    from otel_rollout.analysis import StepStats
    from otel_rollout.record import RequestRecord

_FRACTION_BUCKETS = (0.01, 0.02, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)
_COUNT_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 65536)


class RequestInstruments:
    """The GenAI request histograms (duration, time to first token, time per output token,
    tokens), queue time, and the counter of spans a full emitter queue dropped."""

    def __init__(self, meter: Meter, config: RolloutConfig) -> None:
        lat = config.latency_buckets
        self.duration = meter.create_histogram(
            gen_ai_metrics.GEN_AI_SERVER_REQUEST_DURATION,
            unit="s",
            description="Generate request latency, arrival to last token, in the engine.",
            explicit_bucket_boundaries_advisory=lat,
        )
        self.ttft = meter.create_histogram(
            gen_ai_metrics.GEN_AI_SERVER_TIME_TO_FIRST_TOKEN,
            unit="s",
            description="Arrival to first output token.",
            explicit_bucket_boundaries_advisory=config.ttft_buckets,
        )
        self.tpot = meter.create_histogram(
            gen_ai_metrics.GEN_AI_SERVER_TIME_PER_OUTPUT_TOKEN,
            unit="s",
            description="Decode time per output token after the first.",
            explicit_bucket_boundaries_advisory=config.tpot_buckets,
        )
        self.tokens = meter.create_histogram(
            gen_ai_metrics.GEN_AI_CLIENT_TOKEN_USAGE,
            unit="{token}",
            description="Input and output tokens per request; output is the response length.",
            explicit_bucket_boundaries_advisory=config.token_buckets,
        )
        self.queue_time = meter.create_histogram(
            ROLLOUT_QUEUE_TIME,
            unit="s",
            description="Arrival until the scheduler first ran it.",
            explicit_bucket_boundaries_advisory=lat,
        )
        self.dropped = meter.create_counter(
            METRIC_TELEMETRY_DROPPED,
            unit="{record}",
            description="Request records whose spans were never made because the background "
            "emitter's queue was full (OTEL_ROLLOUT_EMIT_QUEUE); their metric points were "
            "recorded in the caller.",
        )

    def record(
        self,
        record: RequestRecord,
        labels: tuple[dict[str, str], dict[str, str], dict[str, str]],
        ctx: Context,
    ) -> None:
        """One request's points, in ``ctx`` (its span's: exemplars name it)."""
        attrs, inputs, outputs = labels
        self.duration.record(record.duration_s, attrs, context=ctx)
        if (ttft := record.ttft_s) is not None:
            self.ttft.record(ttft, attrs, context=ctx)
        if (tpot := record.tpot_s) is not None:
            self.tpot.record(tpot, attrs, context=ctx)
        if (queue := record.queue_time_s) is not None:
            self.queue_time.record(queue, attrs, context=ctx)
        if record.prompt_tokens is not None:
            self.tokens.record(record.prompt_tokens, inputs, context=ctx)
        if record.output_tokens is not None:
            self.tokens.record(record.output_tokens, outputs, context=ctx)


class StepInstruments:
    """The ``rollout.step.*`` histograms: one point per step, created once per emitter."""

    def __init__(self, meter: Meter, config: RolloutConfig) -> None:
        def hist(name: str, unit: str, buckets: Sequence[float], desc: str) -> metrics.Histogram:
            return meter.create_histogram(
                name, unit=unit, description=desc, explicit_bucket_boundaries_advisory=buckets
            )

        lat = config.latency_buckets
        self.duration = hist(STEP_DURATION, "s", lat, "Wall time of a training step's scope.")
        self.tail_duration = hist(
            STEP_TAIL_DURATION,
            "s",
            lat,
            "Time from the tail quantile of finishes to the last finish.",
        )
        self.tail_requests = hist(
            STEP_TAIL_REQUESTS,
            "{request}",
            _COUNT_BUCKETS,
            "Requests still running when the tail began.",
        )
        self.requests = hist(STEP_REQUESTS, "{request}", _COUNT_BUCKETS, "Requests in the step.")
        self.straggler_ratio = hist(
            STEP_STRAGGLER_RATIO,
            "1",
            DEFAULT_RATIO_BUCKETS,
            "Slowest request latency over the median.",
        )
        self.truncation_ratio = hist(
            STEP_TRUNCATION_RATIO,
            "1",
            _FRACTION_BUCKETS,
            "Share of requests that stopped at max_tokens.",
        )
        self.idle_capacity = hist(
            STEP_IDLE_CAPACITY,
            "s",
            IDLE_CAPACITY_BUCKETS,
            "Request-seconds of in-flight capacity left unused during the rollout window.",
        )
        self.idle_fraction = hist(
            STEP_IDLE_FRACTION,
            "1",
            _FRACTION_BUCKETS,
            "Idle capacity as a share of peak in-flight × window.",
        )
        self.output_tokens = hist(
            STEP_OUTPUT_TOKENS,
            "{token}",
            config.token_buckets,
            "Per-step response length statistics.",
        )
        self.phase_duration = hist(
            STEP_PHASE_DURATION,
            "s",
            lat,
            "Wall time of one phase of a training step (reward, log-probs, update, weight sync, …).",
        )

    def record(self, stats: StepStats, attrs: dict[str, str], ctx: Context) -> None:
        for instrument, value in (
            (self.duration, stats.duration_s),
            (self.tail_duration, stats.tail_duration_s),
            (self.tail_requests, stats.tail_requests),
            (self.requests, stats.requests),
            (self.straggler_ratio, stats.straggler_ratio),
            (self.truncation_ratio, stats.truncation_ratio),
            (self.idle_capacity, stats.idle_capacity_s),
            (self.idle_fraction, stats.idle_fraction),
        ):
            instrument.record(value, attrs, context=ctx)
        for stat, tokens in (
            ("max", stats.output_tokens_max),
            ("p50", stats.output_tokens_p50),
            ("p90", stats.output_tokens_p90),
        ):
            self.output_tokens.record(tokens, {**attrs, ROLLOUT_STATISTIC: stat}, context=ctx)
