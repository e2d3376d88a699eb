"""The instruments otel_rollout records into: per request, and per step. Created once per meter
user (an engine's telemetry, the job's step telemetry), never per request or per step.

Names, units and bucket advice live here and in :mod:`otel_rollout.semconv`; what a point's
labels are is :mod:`otel_rollout.attributes`' business; when points are recorded is
:mod:`otel_rollout.telemetry`'s.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from opentelemetry import metrics
from opentelemetry.metrics import Meter
from opentelemetry.semconv._incubating.metrics import gen_ai_metrics

from otel_rollout.config import RolloutConfig
from otel_rollout.figures import COUNT_BUCKETS, STEP_FIGURES, step_metrics
from otel_rollout.semconv import (
    GEN_AI_OPERATION_INPUT_TOKENS,
    GEN_AI_OPERATION_OUTPUT_TOKENS,
    GEN_AI_USAGE_CACHE_READ_COUNTER,
    GEN_AI_USAGE_INPUT_TOKENS_COUNTER,
    GEN_AI_USAGE_OUTPUT_TOKENS_COUNTER,
    METRIC_TELEMETRY_DROPPED,
    RL_LOOP_DURATION,
    ROLLOUT_CAUSE,
    ROLLOUT_QUEUE_TIME,
    ROLLOUT_STATISTIC,
    ROLLOUT_WHATIF,
    STEP_CAUSE_DURATION,
    STEP_PHASE_DURATION,
    STEP_WHATIF_SAVED,
    TRAJECTORY_DURATION,
    TRAJECTORY_TURNS,
)

if TYPE_CHECKING:
    from opentelemetry.context import Context

    from otel_rollout.analysis import StepStats
    from otel_rollout.record import RequestRecord


LabelSets = tuple[dict[str, str], dict[str, str], dict[str, str]]
"""A request's metric labels: (every figure's, input tokens', output tokens'), as
:func:`otel_rollout.attributes.metric_attribute_sets` builds them for the chosen conventions."""


class RequestInstruments:
    """The GenAI request histograms (duration, time to first token, time per output token),
    the token figures in the conventions the configuration chose, queue time, and the counter of
    spans a full emitter queue dropped."""

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
        self.tokens: TokenUsage | LatestTokens = (
            LatestTokens(meter, config) if config.gen_ai_latest else TokenUsage(meter, config)
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
        labels: LabelSets,
        ctx: Context,
    ) -> None:
        """One request's points, in ``ctx`` (its span's: exemplars name it)."""
        attrs = labels[0]
        self.duration.record(record.duration_s, attrs, context=ctx)
        if (ttft := record.ttft_s) is not None:
            self.ttft.record(ttft, attrs, context=ctx)
        if (tpot := record.tpot_s) is not None:
            self.tpot.record(tpot, attrs, context=ctx)
        if (queue := record.queue_time_s) is not None:
            self.queue_time.record(queue, attrs, context=ctx)
        self.tokens.record(record, labels, ctx)


class TokenUsage:
    """Tokens in the default conventions: one ``gen_ai.client.token.usage`` histogram, input and
    output told apart by ``gen_ai.token.type`` (the conventions of opentelemetry.semconv)."""

    def __init__(self, meter: Meter, config: RolloutConfig) -> None:
        self.histogram = meter.create_histogram(
            gen_ai_metrics.GEN_AI_CLIENT_TOKEN_USAGE,
            unit="{token}",
            description="Input and output tokens per request; output is the response length.",
            explicit_bucket_boundaries_advisory=config.token_buckets,
        )

    def record(
        self,
        record: RequestRecord,
        labels: LabelSets,
        ctx: Context,
    ) -> None:
        _, inputs, outputs = labels
        if record.prompt_tokens is not None:
            self.histogram.record(record.prompt_tokens, inputs, context=ctx)
        if record.output_tokens is not None:
            self.histogram.record(record.output_tokens, outputs, context=ctx)


class LatestTokens:
    """Tokens in the GenAI conventions' newest names (``OTEL_SEMCONV_STABILITY_OPT_IN=
    gen_ai_latest_experimental``): per-request histograms without a token-type label, and usage
    counters by modality, the cache-read one among them. The counters' sums equal the
    histograms' (every request's count is added once to each), so a rate of tokens needs no
    histogram sum."""

    def __init__(self, meter: Meter, config: RolloutConfig) -> None:
        def histogram(name: str, what: str) -> metrics.Histogram:
            return meter.create_histogram(
                name,
                unit="{token}",
                description=f"{what} per request.",
                explicit_bucket_boundaries_advisory=config.token_buckets,
            )

        def counter(name: str, what: str) -> metrics.Counter:
            return meter.create_counter(name, unit="{token}", description=what)

        self.input_histogram = histogram(GEN_AI_OPERATION_INPUT_TOKENS, "Input (prompt) tokens")
        self.output_histogram = histogram(
            GEN_AI_OPERATION_OUTPUT_TOKENS, "Output tokens (the response length)"
        )
        self.input_usage = counter(
            GEN_AI_USAGE_INPUT_TOKENS_COUNTER, "Input (prompt) tokens, cached ones included."
        )
        self.output_usage = counter(GEN_AI_USAGE_OUTPUT_TOKENS_COUNTER, "Output tokens.")
        self.cache_read_usage = counter(
            GEN_AI_USAGE_CACHE_READ_COUNTER,
            "Input tokens the engine served from its prefix cache.",
        )

    def record(
        self,
        record: RequestRecord,
        labels: LabelSets,
        ctx: Context,
    ) -> None:
        attrs, modal_in, modal_out = labels  # modal_*: + gen_ai.token.modality
        if (prompt := record.prompt_tokens) is not None:
            self.input_histogram.record(prompt, attrs, context=ctx)
            self.input_usage.add(prompt, modal_in, context=ctx)
            if (cached := record.cached_tokens) is not None:
                self.cache_read_usage.add(cached, modal_in, context=ctx)
        if (output := record.output_tokens) is not None:
            self.output_histogram.record(output, attrs, context=ctx)
            self.output_usage.add(output, modal_out, context=ctx)


class StepInstruments:
    """The ``rollout.step.*`` histograms (one point per step), made from
    :data:`otel_rollout.figures.STEP_FIGURES`, and the phase histogram; created once per emitter."""

    def __init__(self, meter: Meter, config: RolloutConfig) -> None:
        self.histograms: dict[str, metrics.Histogram] = {
            name: meter.create_histogram(
                name,
                unit=figure.unit,
                description=figure.description,
                explicit_bucket_boundaries_advisory=figure.boundaries(config),
            )
            for name, figure in step_metrics().items()
        }

        def seconds(name: str, description: str) -> metrics.Histogram:
            return meter.create_histogram(
                name,
                unit="s",
                description=description,
                explicit_bucket_boundaries_advisory=config.latency_buckets,
            )

        self.phase_duration = seconds(
            STEP_PHASE_DURATION,
            "Wall time of one phase of a training step (reward, log-probs, update, weight "
            "sync, …).",
        )
        self.cause_duration = seconds(
            STEP_CAUSE_DURATION,
            "Seconds of a training step by cause (length-bound, queue, held, …): why the step "
            "took its time.",
        )
        self.whatif_saved = seconds(
            STEP_WHATIF_SAVED,
            "Estimated seconds a change would have saved a training step (max_tokens capped at "
            "p95/p99, a stop at 90/95 %, balanced replicas), by rollout.whatif.",
        )
        self._rl_loop_duration = (
            seconds(RL_LOOP_DURATION, "Duration of one RL training iteration (our step).")
            if config.rl_latest  # the proposed rl.* conventions' opt-in
            else None
        )

    def rl_loop_duration(self, seconds: float) -> None:
        """``rl.loop.duration``: every step's duration, under the ``rl.*`` opt-in only."""
        if self._rl_loop_duration is not None:
            self._rl_loop_duration.record(seconds)

    def record(self, stats: StepStats, attrs: dict[str, str], ctx: Context) -> None:
        for figure in STEP_FIGURES:
            if figure.metric is None:
                continue
            labels = (
                attrs
                if figure.statistic is None
                else {**attrs, ROLLOUT_STATISTIC: figure.statistic}
            )
            value = figure.value(stats)
            if value is not None:  # a figure of a part the step lacks (its trajectories)
                self.histograms[figure.metric].record(value, labels, context=ctx)
        if stats.causes is not None:  # every cause every step: averages and stacks add up
            for cause, seconds in stats.causes.seconds.items():
                self.cause_duration.record(seconds, {**attrs, ROLLOUT_CAUSE: cause}, context=ctx)
        if stats.whatif is not None:
            for change, saved in stats.whatif.savings():
                self.whatif_saved.record(saved, {**attrs, ROLLOUT_WHATIF: change}, context=ctx)


class TrajectoryInstruments:
    """Agentic trajectories (:mod:`otel_rollout.trajectories`): duration and turns, one point per
    trajectory, labelled with how it ended."""

    def __init__(self, meter: Meter, config: RolloutConfig) -> None:
        self.duration = meter.create_histogram(
            TRAJECTORY_DURATION,
            unit="s",
            description="Wall time of one sample's trajectory (turns, tool calls, scoring).",
            explicit_bucket_boundaries_advisory=config.latency_buckets,
        )
        self.turns = meter.create_histogram(
            TRAJECTORY_TURNS,
            unit="{request}",
            description="Engine requests (turns) of one trajectory.",
            explicit_bucket_boundaries_advisory=COUNT_BUCKETS,
        )

    def record(self, duration_s: float, turns: int, attrs: dict[str, str], ctx: Context) -> None:
        self.duration.record(duration_s, attrs, context=ctx)
        self.turns.record(turns, attrs, context=ctx)
