"""Record → span + metric points, and step → step span + step metric points: the one emitter.

Engine adapters build :class:`~otel_rollout.record.RequestRecord` objects and call
:meth:`Telemetry.emit`; the step scope hands its analysis to :meth:`Telemetry.finish_step`. Nothing
else in the package touches tracers or meters. Spans are created once the request has finished,
with the engine's own timestamps, so a span's start and end are when the engine saw the request
arrive and finish — not when we happened to look.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from opentelemetry import context as otel_context
from opentelemetry import metrics, trace
from opentelemetry.metrics import CallbackOptions, Meter, Observation
from opentelemetry.semconv._incubating.attributes import gen_ai_attributes as GenAI
from opentelemetry.semconv._incubating.metrics import gen_ai_metrics
from opentelemetry.semconv.attributes import error_attributes
from opentelemetry.trace import SpanKind, Status, StatusCode, Tracer

from otel_rollout.config import (
    DEFAULT_RATIO_BUCKETS,
    IDLE_CAPACITY_BUCKETS,
    RolloutConfig,
    load_config,
)
from otel_rollout.context import current_step, step_number
from otel_rollout.guard import LogOnce
from otel_rollout.semconv import (
    BATCH_SPAN_NAME,
    EVENT_FIRST_TOKEN,
    METRIC_ACTIVE,
    METRIC_ENGINE_BUSY_TIME,
    METRIC_ENGINE_IDLE_TIME,
    ROLLOUT_BATCH_SIZE,
    ROLLOUT_CACHED_TOKENS,
    ROLLOUT_FINISH_REASON,
    ROLLOUT_QUEUE_TIME,
    ROLLOUT_STATISTIC,
    ROLLOUT_STEP,
    ROLLOUT_STEP_ATTRIBUTE_PREFIX,
    ROLLOUT_TIMING_SOURCE,
    ROLLOUT_TTFT,
    STEP_ATTR_IDLE_CAPACITY,
    STEP_ATTR_LATENCY_MAX,
    STEP_ATTR_LATENCY_P50,
    STEP_ATTR_LATENCY_P90,
    STEP_ATTR_OUTPUT_TOKENS_MAX,
    STEP_ATTR_OUTPUT_TOKENS_P50,
    STEP_ATTR_OUTPUT_TOKENS_P90,
    STEP_ATTR_PEAK_ACTIVE,
    STEP_ATTR_TAIL_DURATION,
    STEP_ATTR_TAIL_FRACTION,
    STEP_DURATION,
    STEP_IDLE_CAPACITY,
    STEP_IDLE_FRACTION,
    STEP_MISSING_CALLS,
    STEP_OUTPUT_TOKENS,
    STEP_PARTIAL,
    STEP_REQUESTS,
    STEP_SPAN_NAME,
    STEP_STRAGGLER_RATIO,
    STEP_TAIL_DURATION,
    STEP_TAIL_REQUESTS,
    STEP_TRUNCATION_RATIO,
)
from otel_rollout.version import __version__

if TYPE_CHECKING:
    from opentelemetry.context import Context

    from otel_rollout.analysis import StepStats
    from otel_rollout.record import RequestRecord

SCHEMA_URL = "https://opentelemetry.io/schemas/1.37.0"
_FRACTION_BUCKETS = (0.01, 0.02, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)
_COUNT_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 65536)


class EngineActivity:
    """In-flight count of one engine, and how long it has spent busy (≥1 request) or idle.

    Fully-async rollouts have no step boundaries, so idleness is exposed as two monotonic
    counters; ``rate(idle) / (rate(idle) + rate(busy))`` is the idle ratio.
    """

    __slots__ = ("active", "busy_ns", "idle_ns", "_since", "_lock")

    def __init__(self) -> None:
        self.active = 0
        self.busy_ns = 0
        self.idle_ns = 0
        self._since = time.monotonic_ns()
        self._lock = threading.Lock()

    def change(self, delta: int) -> None:
        with self._lock:
            self._accrue(time.monotonic_ns())
            self.active = max(0, self.active + delta)

    def totals(self) -> tuple[float, float]:
        with self._lock:
            self._accrue(time.monotonic_ns())
            return self.busy_ns / 1e9, self.idle_ns / 1e9

    def _accrue(self, now: int) -> None:
        if self.active > 0:
            self.busy_ns += now - self._since
        else:
            self.idle_ns += now - self._since
        self._since = now


class Telemetry:
    """The one emitter: every span and instrument otel_rollout makes is made here.

    One per instrumentor (one engine kind), on the providers that instrumentor was given; its
    request instruments and its step instruments are created once, here, never per step.
    """

    def __init__(self, provider: str, tracer: Tracer, meter: Meter, config: RolloutConfig) -> None:
        self.provider = provider
        self.tracer = tracer
        self.config = config
        self.log = LogOnce()
        self._engines: dict[str, EngineActivity] = {}
        self._engines_lock = threading.Lock()
        lat = config.latency_buckets
        self.duration = meter.create_histogram(
            gen_ai_metrics.GEN_AI_SERVER_REQUEST_DURATION, unit="s",
            description="Generate request latency, arrival to last token, in the engine.",
            explicit_bucket_boundaries_advisory=lat)
        self.ttft = meter.create_histogram(
            gen_ai_metrics.GEN_AI_SERVER_TIME_TO_FIRST_TOKEN, unit="s",
            description="Arrival to first output token.",
            explicit_bucket_boundaries_advisory=config.ttft_buckets)
        self.tpot = meter.create_histogram(
            gen_ai_metrics.GEN_AI_SERVER_TIME_PER_OUTPUT_TOKEN, unit="s",
            description="Decode time per output token after the first.",
            explicit_bucket_boundaries_advisory=config.tpot_buckets)
        self.tokens = meter.create_histogram(
            gen_ai_metrics.GEN_AI_CLIENT_TOKEN_USAGE, unit="{token}",
            description="Input and output tokens per request; output is the response length.",
            explicit_bucket_boundaries_advisory=config.token_buckets)
        self.queue_time = meter.create_histogram(
            ROLLOUT_QUEUE_TIME, unit="s", description="Arrival until the scheduler first ran it.",
            explicit_bucket_boundaries_advisory=lat)
        self.active = meter.create_up_down_counter(
            METRIC_ACTIVE, unit="{request}", description="Requests in flight in the engine now.")
        meter.create_observable_counter(
            METRIC_ENGINE_BUSY_TIME, callbacks=[self._observe_busy], unit="s",
            description="Time the engine had at least one request in flight.")
        meter.create_observable_counter(
            METRIC_ENGINE_IDLE_TIME, callbacks=[self._observe_idle], unit="s",
            description="Time the engine had no request in flight.")
        self.step_instruments = StepInstruments(meter, config)

    # --- in-flight --------------------------------------------------------------------------

    def _engine(self, model: str) -> EngineActivity:
        activity = self._engines.get(model)
        if activity is None:
            with self._engines_lock:
                activity = self._engines.setdefault(model, EngineActivity())
        return activity

    def requests_started(self, model: str, operation: str, count: int = 1) -> None:
        with self.log.guard("in-flight accounting"):
            self.active.add(count, self._base_attributes(model, operation))
            self._engine(model).change(count)

    def requests_ended(self, model: str, operation: str, count: int = 1) -> None:
        with self.log.guard("in-flight accounting"):
            self.active.add(-count, self._base_attributes(model, operation))
            self._engine(model).change(-count)

    def _observe_busy(self, options: CallbackOptions) -> Iterator[Observation]:
        for model, activity in list(self._engines.items()):
            yield Observation(activity.totals()[0], self._engine_attributes(model))

    def _observe_idle(self, options: CallbackOptions) -> Iterator[Observation]:
        for model, activity in list(self._engines.items()):
            yield Observation(activity.totals()[1], self._engine_attributes(model))

    def _engine_attributes(self, model: str, provider: str | None = None) -> dict[str, str]:
        return {GenAI.GEN_AI_PROVIDER_NAME: provider or self.provider,
                GenAI.GEN_AI_REQUEST_MODEL: model}

    def _base_attributes(self, model: str, operation: str) -> dict[str, str]:
        return {
            GenAI.GEN_AI_PROVIDER_NAME: self.provider,
            GenAI.GEN_AI_REQUEST_MODEL: model,
            GenAI.GEN_AI_OPERATION_NAME: operation,
        }

    # --- batches ----------------------------------------------------------------------------

    @contextmanager
    def batch(self, model: str, operation: str, size: int) -> Iterator[Context]:
        """A parent span around one offline call; yields the context its children go under.

        Opening and closing are guarded: a failing span processor must neither stop the call nor
        fail it after the engine ran.
        """
        span: trace.Span | None = None
        ctx = otel_context.get_current()
        with self.log.guard("batch span"):
            span = self.tracer.start_span(
                BATCH_SPAN_NAME, kind=SpanKind.INTERNAL,
                attributes={**self._base_attributes(model, operation), ROLLOUT_BATCH_SIZE: size})
            ctx = trace.set_span_in_context(span)
        error: BaseException | None = None
        try:
            yield ctx
        except BaseException as exc:
            error = exc
            raise
        finally:
            with self.log.guard("batch span"):
                if span is not None:
                    if error is not None:
                        _mark_error(span, error)
                    span.end()

    # --- the record → telemetry mapping --------------------------------------------------------

    def emit(self, record: RequestRecord, parent: Context | None = None) -> None:
        """Turn one finished request into its span, metric points and step observation."""
        with self.log.guard("request telemetry"):
            self._emit(record, parent)

    def emit_all(self, records: Sequence[RequestRecord], parent: Context | None = None) -> None:
        with self.log.guard("request telemetry"):
            for record in records:
                self._emit(record, parent)

    def _emit(self, record: RequestRecord, parent: Context | None) -> None:
        span = self.tracer.start_span(
            f"{record.operation} {record.model}", context=parent, kind=SpanKind.INTERNAL,
            start_time=record.arrival_ns, attributes=self._span_attributes(record, parent))
        if record.first_token_ns is not None:
            span.add_event(EVENT_FIRST_TOKEN, timestamp=record.first_token_ns)
        if record.error is not None:
            span.set_status(Status(StatusCode.ERROR, _describe(record.error)))
        span.end(end_time=record.finish_ns)
        span_context = span.get_span_context()
        record.trace_id, record.span_id = span_context.trace_id, span_context.span_id

        ctx = trace.set_span_in_context(span, parent)
        attrs = self._base_attributes(record.model, record.operation)
        if record.finish_reason is not None:
            attrs[ROLLOUT_FINISH_REASON] = record.finish_reason
        if record.error is not None:
            attrs[error_attributes.ERROR_TYPE] = type(record.error).__qualname__
        self.duration.record(record.duration_s, attrs, context=ctx)
        if (ttft := record.ttft_s) is not None:
            self.ttft.record(ttft, attrs, context=ctx)
        if (tpot := record.tpot_s) is not None:
            self.tpot.record(tpot, attrs, context=ctx)
        if (queue := record.queue_time_s) is not None:
            self.queue_time.record(queue, attrs, context=ctx)
        if record.prompt_tokens is not None:
            self.tokens.record(record.prompt_tokens,
                               {**attrs, GenAI.GEN_AI_TOKEN_TYPE: "input"}, context=ctx)
        if record.output_tokens is not None:
            self.tokens.record(record.output_tokens,
                               {**attrs, GenAI.GEN_AI_TOKEN_TYPE: "output"}, context=ctx)

        step = current_step(parent)
        if step is not None:
            step.observe(record)

    # --- steps ----------------------------------------------------------------------------------

    def start_step(self, step: int | None, attributes: Mapping[str, Any]) -> trace.Span:
        """The step span, started now in the current context; extra keys get the step prefix."""
        attrs = {k if k.startswith("rollout.") else ROLLOUT_STEP_ATTRIBUTE_PREFIX + k: v
                 for k, v in attributes.items()}
        if step is not None:
            attrs[ROLLOUT_STEP] = step
        return self.tracer.start_span(STEP_SPAN_NAME, kind=SpanKind.INTERNAL, attributes=attrs)

    def finish_step(self, span: trace.Span, requests: int, stats: StepStats | None,
                    error: BaseException | None, first: RequestRecord | None,
                    missing_calls: int = 0) -> None:
        """Put a step's analysis on its span and into the step metrics, then end the span.

        ``first`` is one of the step's requests: its provider and model label the step's points.
        ``missing_calls`` remote calls never reported: the step is marked partial, and its
        figures are over the ``requests`` that are known.
        """
        try:
            with self.log.guard("step telemetry"):
                if error is not None:
                    span.set_status(Status(StatusCode.ERROR, type(error).__qualname__))
                    span.set_attribute(error_attributes.ERROR_TYPE, type(error).__qualname__)
                span.set_attribute(STEP_REQUESTS, requests)
                if missing_calls:
                    span.set_attributes({STEP_PARTIAL: True, STEP_MISSING_CALLS: missing_calls})
                if stats is not None and first is not None:
                    span.set_attributes(step_span_attributes(stats))
                    self.step_instruments.record(
                        stats, self._engine_attributes(first.model, first.provider),
                        trace.set_span_in_context(span))
        finally:
            with self.log.guard("step span"):
                span.end()

    def _span_attributes(self, record: RequestRecord, parent: Context | None) -> dict[str, Any]:
        attrs: dict[str, Any] = {
            GenAI.GEN_AI_OPERATION_NAME: record.operation,
            GenAI.GEN_AI_PROVIDER_NAME: record.provider,
            GenAI.GEN_AI_REQUEST_MODEL: record.model,
            ROLLOUT_TIMING_SOURCE: record.timing_source,
        }
        optional: tuple[tuple[str, object], ...] = (
            (GenAI.GEN_AI_RESPONSE_ID, record.request_id),
            (GenAI.GEN_AI_REQUEST_MAX_TOKENS, record.max_tokens),
            (GenAI.GEN_AI_REQUEST_TEMPERATURE, record.temperature),
            (GenAI.GEN_AI_REQUEST_TOP_P, record.top_p),
            (GenAI.GEN_AI_REQUEST_CHOICE_COUNT, record.n),
            (GenAI.GEN_AI_USAGE_INPUT_TOKENS, record.prompt_tokens),
            (GenAI.GEN_AI_USAGE_OUTPUT_TOKENS, record.output_tokens),
            (ROLLOUT_CACHED_TOKENS, record.cached_tokens),
            (ROLLOUT_QUEUE_TIME, record.queue_time_s),
            (ROLLOUT_TTFT, record.ttft_s),
            (ROLLOUT_STEP, step_number(parent)),
        )
        for key, value in optional:
            if value is not None:
                attrs[key] = value
        if record.finish_reasons:
            attrs[GenAI.GEN_AI_RESPONSE_FINISH_REASONS] = list(record.finish_reasons)
        if record.error is not None:
            attrs[error_attributes.ERROR_TYPE] = type(record.error).__qualname__
        if self.config.capture_content:
            self._content_attributes(record, attrs)
        return attrs

    def _content_attributes(self, record: RequestRecord, attrs: dict[str, Any]) -> None:
        limit = self.config.content_max_length
        if record.prompt_text is not None:
            attrs[GenAI.GEN_AI_INPUT_MESSAGES] = json.dumps(
                [{"role": "user", "parts": [{"type": "text", "content": record.prompt_text[:limit]}]}])
        if record.completion_texts:
            reasons = record.finish_reasons
            attrs[GenAI.GEN_AI_OUTPUT_MESSAGES] = json.dumps([
                {"role": "assistant", "parts": [{"type": "text", "content": text[:limit]}],
                 "finish_reason": reasons[i] if i < len(reasons) else ""}
                for i, text in enumerate(record.completion_texts)
            ])


def _describe(error: BaseException) -> str:
    text = str(error)
    name = type(error).__qualname__
    return f"{name}: {text[:256]}" if text else name


def _mark_error(span: trace.Span, error: BaseException) -> None:
    span.set_status(Status(StatusCode.ERROR, str(error)[:256]))
    span.set_attribute(error_attributes.ERROR_TYPE, type(error).__qualname__)


def step_span_attributes(stats: StepStats) -> dict[str, float | int]:
    """The step span's analytics attributes (names in README's step-span table)."""
    return {
        STEP_ATTR_TAIL_DURATION: stats.tail_duration_s,
        STEP_TAIL_REQUESTS: stats.tail_requests,
        STEP_ATTR_TAIL_FRACTION: stats.tail_fraction,
        STEP_STRAGGLER_RATIO: stats.straggler_ratio,
        STEP_ATTR_LATENCY_P50: stats.latency_p50_s,
        STEP_ATTR_LATENCY_P90: stats.latency_p90_s,
        STEP_ATTR_LATENCY_MAX: stats.latency_max_s,
        STEP_ATTR_OUTPUT_TOKENS_P50: stats.output_tokens_p50,
        STEP_ATTR_OUTPUT_TOKENS_P90: stats.output_tokens_p90,
        STEP_ATTR_OUTPUT_TOKENS_MAX: stats.output_tokens_max,
        STEP_TRUNCATION_RATIO: stats.truncation_ratio,
        STEP_ATTR_IDLE_CAPACITY: stats.idle_capacity_s,
        STEP_IDLE_FRACTION: stats.idle_fraction,
        STEP_ATTR_PEAK_ACTIVE: stats.peak_active,
    }


class StepInstruments:
    """The ``rollout.step.*`` histograms: one point per step, created once per emitter."""

    def __init__(self, meter: Meter, config: RolloutConfig) -> None:
        def hist(name: str, unit: str, buckets: Sequence[float], desc: str) -> metrics.Histogram:
            return meter.create_histogram(name, unit=unit, description=desc,
                                          explicit_bucket_boundaries_advisory=buckets)

        lat = config.latency_buckets
        self.duration = hist(STEP_DURATION, "s", lat, "Wall time of a training step's scope.")
        self.tail_duration = hist(STEP_TAIL_DURATION, "s", lat,
                                  "Time from the tail quantile of finishes to the last finish.")
        self.tail_requests = hist(STEP_TAIL_REQUESTS, "{request}", _COUNT_BUCKETS,
                                  "Requests still running when the tail began.")
        self.requests = hist(STEP_REQUESTS, "{request}", _COUNT_BUCKETS, "Requests in the step.")
        self.straggler_ratio = hist(STEP_STRAGGLER_RATIO, "1", DEFAULT_RATIO_BUCKETS,
                                    "Slowest request latency over the median.")
        self.truncation_ratio = hist(STEP_TRUNCATION_RATIO, "1", _FRACTION_BUCKETS,
                                     "Share of requests that stopped at max_tokens.")
        self.idle_capacity = hist(
            STEP_IDLE_CAPACITY, "s", IDLE_CAPACITY_BUCKETS,
            "Request-seconds of in-flight capacity left unused during the rollout window.")
        self.idle_fraction = hist(STEP_IDLE_FRACTION, "1", _FRACTION_BUCKETS,
                                  "Idle capacity as a share of peak in-flight × window.")
        self.output_tokens = hist(STEP_OUTPUT_TOKENS, "{token}", config.token_buckets,
                                  "Per-step response length statistics.")

    def record(self, stats: StepStats, attrs: dict[str, str], ctx: Context) -> None:
        for instrument, value in (
                (self.duration, stats.duration_s), (self.tail_duration, stats.tail_duration_s),
                (self.tail_requests, stats.tail_requests), (self.requests, stats.requests),
                (self.straggler_ratio, stats.straggler_ratio),
                (self.truncation_ratio, stats.truncation_ratio),
                (self.idle_capacity, stats.idle_capacity_s),
                (self.idle_fraction, stats.idle_fraction)):
            instrument.record(value, attrs, context=ctx)
        for stat, tokens in (("max", stats.output_tokens_max), ("p50", stats.output_tokens_p50),
                             ("p90", stats.output_tokens_p90)):
            self.output_tokens.record(tokens, {**attrs, ROLLOUT_STATISTIC: stat}, context=ctx)


# --- which emitter steps use -----------------------------------------------------------------

_EMITTERS: list[Telemetry] = []
_EMITTERS_LOCK = threading.Lock()
_DEFAULT: list[Telemetry] = []


def create_telemetry(provider: str, tracer_provider: Any = None, meter_provider: Any = None,
                     config: RolloutConfig | None = None) -> Telemetry:
    """An emitter on the given providers (the global ones when ``None``), scope ``otel_rollout.<provider>``.

    Each engine has its own instrumentation scope: on a shared meter the second engine's
    observable counters would be duplicates the SDK ignores.
    """
    scope = f"otel_rollout.{provider}"
    tracer = trace.get_tracer(scope, __version__, tracer_provider=tracer_provider,
                              schema_url=SCHEMA_URL)
    meter = metrics.get_meter(scope, __version__, meter_provider=meter_provider,
                              schema_url=SCHEMA_URL)
    return Telemetry(provider, tracer, meter, config or load_config())


def register(telemetry: Telemetry) -> None:
    """Make ``telemetry`` the emitter of steps (the most recently instrumented engine's wins)."""
    with _EMITTERS_LOCK:
        if telemetry in _EMITTERS:
            _EMITTERS.remove(telemetry)
        _EMITTERS.append(telemetry)


def unregister(telemetry: Telemetry) -> None:
    with _EMITTERS_LOCK:
        if telemetry in _EMITTERS:
            _EMITTERS.remove(telemetry)


def step_emitter() -> Telemetry:
    """The emitter for step spans: an instrumentor's, else one on the global providers.

    Steps work without any instrumentor (``rollout_step`` around work in another process still
    gives the step span); they then use the global providers, as any OTel API user would.
    """
    with _EMITTERS_LOCK:
        if _EMITTERS:
            return _EMITTERS[-1]
        if not _DEFAULT:
            _DEFAULT.append(create_telemetry("rollout", config=load_config(warn=False)))
        return _DEFAULT[0]
