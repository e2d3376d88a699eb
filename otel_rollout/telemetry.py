"""Record → span + metric points, and step → step span + step metric points: the one emitter.

Engine adapters build :class:`~otel_rollout.record.RequestRecord` objects and call
:meth:`Telemetry.emit`; the step scope hands its analysis to :meth:`Telemetry.finish_step`. Nothing
else in the package touches tracers or meters. Spans are created once the request has finished,
with the engine's own timestamps, so a span's start and end are when the engine saw the request
arrive and finish — not when we happened to look.
"""

from __future__ import annotations

import copy
import json
import os
import threading
import time
import weakref
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
from otel_rollout.emitter import PACE_WAIT_S, Emitter, Pacer
from otel_rollout.guard import LogOnce
from otel_rollout.sdk import drain_before_provider_flush
from otel_rollout.semconv import (
    BATCH_SPAN_NAME,
    EVENT_FIRST_TOKEN,
    METRIC_ACTIVE,
    METRIC_ENGINE_BUSY_TIME,
    METRIC_ENGINE_IDLE_TIME,
    METRIC_TELEMETRY_DROPPED,
    ROLLOUT_BATCH_SIZE,
    ROLLOUT_CACHED_TOKENS,
    ROLLOUT_DROP_REASON,
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
_NO_SPAN = otel_context.Context()
"""The context of points whose span was given up at exit: no exemplar names a span that never was."""
_COUNT_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 65536)


class EngineActivity:
    """In-flight count of one engine, and how long it has spent busy (≥1 request) or idle.

    Fully-async rollouts have no step boundaries, so idleness is exposed as two monotonic
    counters; ``rate(idle) / (rate(idle) + rate(busy))`` is the idle ratio. The in-flight count
    per operation feeds the observable ``rollout.requests.active``: a request pays a lock and a
    clock read here instead of two SDK measurements.
    """

    __slots__ = ("active", "by_operation", "busy_ns", "idle_ns", "_since", "_lock")

    def __init__(self) -> None:
        self.active = 0
        self.by_operation: dict[str, int] = {}
        self.busy_ns = 0
        self.idle_ns = 0
        self._since = time.monotonic_ns()
        self._lock = threading.Lock()

    def change(self, delta: int, operation: str = "") -> None:
        with self._lock:
            self._accrue(time.monotonic_ns())
            self.active = max(0, self.active + delta)
            ops = self.by_operation
            ops[operation] = max(0, ops.get(operation, 0) + delta)

    def totals(self) -> tuple[float, float]:
        with self._lock:
            self._accrue(time.monotonic_ns())
            return self.busy_ns / 1e9, self.idle_ns / 1e9

    def operations(self) -> list[tuple[str, int]]:
        with self._lock:
            return list(self.by_operation.items())

    def _accrue(self, now: int) -> None:
        if self.active > 0:
            self.busy_ns += now - self._since
        else:
            self.idle_ns += now - self._since
        self._since = now


class _MeterObservers:
    """The observable instruments of one meter, reporting for every :class:`Telemetry` on it.

    The SDK keeps the first observable instrument of a name on a meter and ignores a second
    one's callbacks, so instruments registered per ``Telemetry`` would leave all but the first
    emitter on a shared meter unreported. They are registered once per meter instead, and their
    callbacks sum over the meter's members (same attributes from two members add up).
    """

    def __init__(self, meter: Meter) -> None:
        self.members: weakref.WeakSet[Telemetry] = weakref.WeakSet()
        meter.create_observable_up_down_counter(
            METRIC_ACTIVE,
            callbacks=[self._active],
            unit="{request}",
            description="Requests in flight in the engine now.",
        )
        meter.create_observable_counter(
            METRIC_ENGINE_BUSY_TIME,
            callbacks=[self._busy],
            unit="s",
            description="Time the engine had at least one request in flight.",
        )
        meter.create_observable_counter(
            METRIC_ENGINE_IDLE_TIME,
            callbacks=[self._idle],
            unit="s",
            description="Time the engine had no request in flight.",
        )

    def _sum(self, values: Iterator[tuple[dict[str, str], float]]) -> Iterator[Observation]:
        totals: dict[frozenset[tuple[str, str]], tuple[dict[str, str], float]] = {}
        for attrs, value in values:
            key = frozenset(attrs.items())
            seen = totals.get(key)
            totals[key] = (attrs, value + (seen[1] if seen else 0))
        for attrs, value in totals.values():
            yield Observation(value, attrs)

    def _active(self, options: CallbackOptions) -> Iterator[Observation]:
        return self._sum(
            (t._base_attributes(model, op), n)
            for t in list(self.members)
            for model, activity in list(t._engines.items())
            for op, n in activity.operations()
        )

    def _busy(self, options: CallbackOptions) -> Iterator[Observation]:
        return self._sum(
            (t._engine_attributes(model), activity.totals()[0])
            for t in list(self.members)
            for model, activity in list(t._engines.items())
        )

    def _idle(self, options: CallbackOptions) -> Iterator[Observation]:
        return self._sum(
            (t._engine_attributes(model), activity.totals()[1])
            for t in list(self.members)
            for model, activity in list(t._engines.items())
        )


_OBSERVERS: dict[int, tuple[Meter, _MeterObservers]] = {}
_OBSERVERS_LOCK = threading.Lock()


def _observers(meter: Meter) -> _MeterObservers:
    """The meter's shared observable instruments, registered on its first Telemetry."""
    with _OBSERVERS_LOCK:
        entry = _OBSERVERS.get(id(meter))
        if entry is None or entry[0] is not meter:
            entry = (meter, _MeterObservers(meter))  # the meter is kept: its id stays unique
            _OBSERVERS[id(meter)] = entry
        return entry[1]


class _PresetIds:
    """An id generator for the emitter's tracer that returns the ids the caller already chose.

    A request's trace and span ids are drawn on the caller's thread, when its record is handed
    over, so the step analysis, reports and Ray step reports have them at once — without waiting
    for the background emitter to make the span. The emitter thread sets them right before it
    starts the span; anything else falls through to the provider's own generator.
    """

    __slots__ = ("inner", "trace_id", "span_id")

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.trace_id = 0
        self.span_id = 0

    def generate_span_id(self) -> int:
        return self.span_id or int(self.inner.generate_span_id())

    def generate_trace_id(self) -> int:
        return self.trace_id or int(self.inner.generate_trace_id())

    def is_trace_id_random(self) -> bool:
        return bool(self.inner.is_trace_id_random())


def _preset_tracer(tracer: Tracer) -> tuple[Tracer, _PresetIds | None]:
    """A copy of an SDK tracer (same provider, scope, processors) whose ids can be preset."""
    inner = getattr(tracer, "id_generator", None)
    if inner is None or not callable(getattr(inner, "generate_span_id", None)):
        return tracer, None  # not an SDK tracer (no-op, proxy): ids are set at emission
    clone = copy.copy(tracer)
    preset = _PresetIds(inner)
    clone.id_generator = preset  # type: ignore[attr-defined]
    return clone, preset


def _pace_every() -> int:
    """Spans between two drains of the tracer provider: a quarter of the batch queue."""
    try:
        size = int(os.environ.get("OTEL_BSP_MAX_QUEUE_SIZE", "") or 2048)
    except ValueError:
        size = 2048
    return max(1, size // 4)


class Telemetry:
    """The one emitter: every span and instrument otel_rollout makes is made here.

    One per instrumentor (one engine kind), on the providers that instrumentor was given; its
    request instruments and its step instruments are created once, here, never per step.

    Request records are handed to a background :class:`~otel_rollout.emitter.Emitter` (unless
    ``OTEL_ROLLOUT_EMIT_QUEUE=0``): the caller pays for building the record, choosing its ids and
    one queue append; spans and metric points are made on the emitter's thread.
    ``otel_rollout.sdk.force_flush()`` and a normal exit flush it; a step's end does not need to,
    because the step already has its records and their ids.
    """

    def __init__(
        self,
        provider: str,
        tracer: Tracer,
        meter: Meter,
        config: RolloutConfig,
        tracer_provider: Any = None,
        scope: str | None = None,
        meter_provider: Any = None,
    ) -> None:
        self.provider = provider
        self.tracer = tracer
        self.config = config
        self.log = LogOnce()
        self._tracer_provider = tracer_provider
        self._meter_provider = meter_provider
        self._meter = meter
        self._own_steps: StepTelemetry | None = None
        self._scope = scope
        self._engines: dict[str, EngineActivity] = {}
        self._engines_lock = threading.Lock()
        self._request_tracer, self._preset = _preset_tracer(tracer)
        self._emitter: Emitter | None = None
        self._inline_pacer: Pacer | None = None
        self._emitter_lock = threading.Lock()
        self._label_sets: dict[
            tuple[str, str, str | None, str | None],
            tuple[dict[str, str], dict[str, str], dict[str, str]],
        ] = {}
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
        _observers(meter).members.add(self)

    @property
    def steps(self) -> StepTelemetry:
        """Where the steps of this engine's calls go: the job's step scope on the same providers.

        A Telemetry made directly from a tracer and a meter (no providers known) gives its steps
        that same tracer and meter: what the caller handed over is where telemetry goes.
        """
        if self._scope is None:
            if self._own_steps is None:
                self._own_steps = StepTelemetry(self.tracer, self._meter, self.config)
            return self._own_steps
        return step_telemetry(self._tracer_provider, self._meter_provider)

    # --- in-flight --------------------------------------------------------------------------

    def _engine(self, model: str) -> EngineActivity:
        activity = self._engines.get(model)
        if activity is None:
            with self._engines_lock:
                activity = self._engines.setdefault(model, EngineActivity())
        return activity

    def requests_started(self, model: str, operation: str, count: int = 1) -> None:
        with self.log.guard("in-flight accounting"):
            self._engine(model).change(count, operation)

    def requests_ended(self, model: str, operation: str, count: int = 1) -> None:
        with self.log.guard("in-flight accounting"):
            self._engine(model).change(-count, operation)

    def _engine_attributes(self, model: str, provider: str | None = None) -> dict[str, str]:
        return {
            GenAI.GEN_AI_PROVIDER_NAME: provider or self.provider,
            GenAI.GEN_AI_REQUEST_MODEL: model,
        }

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
                BATCH_SPAN_NAME,
                kind=SpanKind.INTERNAL,
                attributes={**self._base_attributes(model, operation), ROLLOUT_BATCH_SIZE: size},
            )
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
        self.emit_all((record,), parent)

    def emit_all(self, records: Sequence[RequestRecord], parent: Context | None = None) -> None:
        """Hand finished requests over: observed by their step now, emitted in the background.

        ``parent`` ``None`` means the caller's current context, captured here (the emitter's
        thread has its own). Each record gets its trace and span ids now, so whoever holds it —
        the step's analysis, a Ray step report — can name its span before the span exists.
        """
        with self.log.guard("request telemetry"):
            if parent is None:
                parent = otel_context.get_current()
            capacity = self.config.emit_queue
            if self._preset is None and isinstance(self.tracer, trace.ProxyTracer):
                self._resolve_proxy()
            if capacity <= 0 or self._preset is None:
                self._emit_inline(records, parent)
                return
            self._assign_ids(records, parent)
            step = current_step(parent)
            if step is not None:
                for record in records:
                    step.observe(record)
            emitter = self._emitter or self._start_emitter()
            emitter.capacity = capacity
            refused = emitter.submit(records, parent)
            if refused:
                # The queue is full: these records lose their spans, never their counts. Metric
                # points cost CPU only, so the caller records them now (~10 µs each).
                for record in records[len(records) - refused :]:
                    self._record_points(record, _NO_SPAN)

    def _resolve_proxy(self) -> None:
        """Made before the SDK was set up: once it is, the emitter gets a tracer of its own."""
        provider = self._tracer_provider or trace.get_tracer_provider()
        if self._scope is None or isinstance(provider, trace.ProxyTracerProvider):
            return
        real = trace.get_tracer(
            self._scope, __version__, tracer_provider=provider, schema_url=SCHEMA_URL
        )
        self._request_tracer, self._preset = _preset_tracer(real)

    def _emit_inline(self, records: Sequence[RequestRecord], parent: Context) -> None:
        """``OTEL_ROLLOUT_EMIT_QUEUE=0`` (or a tracer whose ids cannot be preset): as it happens."""
        step = current_step(parent)
        every = _pace_every()
        for done, record in enumerate(records, 1):
            self._emit(record, parent, self.tracer, None)
            if step is not None:
                step.observe(record)
            if done % every == 0:
                # Synchronous emission paces on the caller's path, as the emitter does off it: a
                # burst larger than the span queue must not be dropped either way. Bounded: a
                # stuck exporter holds the caller for one PACE_WAIT_S, then is not waited on again.
                if self._inline_pacer is None:
                    self._inline_pacer = Pacer(self._drain_spans, PACE_WAIT_S)
                self._inline_pacer.pace()

    def _assign_ids(self, records: Sequence[RequestRecord], parent: Context) -> None:
        """The ids the SDK would draw at ``start_span``, drawn now from the same generator."""
        ids = self._preset.inner  # type: ignore[union-attr]  # checked by the caller
        parent_ctx = trace.get_current_span(parent).get_span_context()
        trace_id = parent_ctx.trace_id if parent_ctx.is_valid else 0
        span_id = ids.generate_span_id
        for record in records:
            record.trace_id = trace_id or ids.generate_trace_id()
            record.span_id = span_id()

    def _start_emitter(self) -> Emitter:
        with self._emitter_lock:
            if self._emitter is None:
                # a provider's own force_flush()/shutdown() must see what the emitter holds
                with self.log.guard("provider flush hook"):
                    drain_before_provider_flush()
                self._emitter = Emitter(
                    self._emit_background,
                    self.config.emit_queue,
                    name=f"otel_rollout-emitter-{self.provider}",
                    pace=self._drain_spans,
                    pace_every=_pace_every(),
                    on_drop=self._dropped,
                    on_error=lambda exc: self.log.failed("request telemetry", exc),
                )
            return self._emitter

    def _emit_background(
        self, records: Sequence[RequestRecord], parent: Context, spans: bool = True
    ) -> None:
        tracer, preset, guard = (
            self._request_tracer,
            self._preset,
            self.log.guard("request telemetry"),
        )
        for record in records:
            with guard:  # one record's failure does not cost the others their telemetry
                if spans:
                    self._emit(record, parent, tracer, preset)
                else:
                    self._record_points(record, _NO_SPAN)

    def _drain_spans(self) -> None:
        """Let the tracer provider export what it holds (on the emitter's thread).

        A ``BatchSpanProcessor`` holds 2,048 spans by default and drops the rest ("Queue full,
        dropping Span"): 8,192 spans made in one burst arrived as 3,066. Draining after every
        quarter-queue of spans keeps its queue from ever filling.
        """
        provider = self._tracer_provider or trace.get_tracer_provider()
        flush = getattr(provider, "force_flush", None)
        if flush is not None:
            flush()

    def _dropped(self, count: int) -> None:
        """The queue was full: count what is lost and say, once, which setting to raise."""
        with self.log.guard("dropped records"):
            self.dropped.add(
                count,
                {GenAI.GEN_AI_PROVIDER_NAME: self.provider, ROLLOUT_DROP_REASON: "queue_full"},
            )
        self.log.warn(
            "emit queue full",
            "otel_rollout: %d request span(s) dropped: the background emitter's queue "
            "of %d records was full (raise OTEL_ROLLOUT_EMIT_QUEUE, or set it to 0 to "
            "emit in the caller); their metric points were recorded, the spans counted in "
            "%s. Further drops are only counted.",
            count,
            self.config.emit_queue,
            METRIC_TELEMETRY_DROPPED,
        )

    def flush(self, timeout_s: float = 30.0) -> bool:
        """Wait until every record handed to this emitter so far has its span and points."""
        emitter = self._emitter
        return True if emitter is None else emitter.flush(timeout_s)

    def _emit(
        self,
        record: RequestRecord,
        parent: Context | None,
        tracer: Tracer,
        preset: _PresetIds | None,
    ) -> None:
        if preset is not None:
            preset.trace_id, preset.span_id = record.trace_id, record.span_id
        span = tracer.start_span(
            f"{record.operation} {record.model}",
            context=parent,
            kind=SpanKind.INTERNAL,
            start_time=record.arrival_ns,
            attributes=self._span_attributes(record, parent),
        )
        if preset is not None:
            preset.trace_id = preset.span_id = 0
        if record.first_token_ns is not None:
            span.add_event(EVENT_FIRST_TOKEN, timestamp=record.first_token_ns)
        if record.error is not None:
            _mark_error(span, record.error)
        span.end(end_time=record.finish_ns)
        span_context = span.get_span_context()
        record.trace_id, record.span_id = span_context.trace_id, span_context.span_id
        self._record_points(record, trace.set_span_in_context(span, parent))

    def _record_points(self, record: RequestRecord, ctx: Context) -> None:
        """A request's metric points, in ``ctx`` (its span's: exemplars name it)."""
        attrs, inputs, outputs = self._metric_attributes(record)
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

    def _metric_attributes(
        self, record: RequestRecord
    ) -> tuple[dict[str, str], dict[str, str], dict[str, str]]:
        """A request's metric label sets, built once per label combination (labels are bounded:
        model, operation, finish reason, error type), not three dicts per request."""
        error = type(record.error).__qualname__ if record.error is not None else None
        reason = record.finish_reason
        key = (record.model, record.operation, reason, error)
        cached = self._label_sets.get(key)
        if cached is None:
            attrs = self._base_attributes(record.model, record.operation)
            if reason is not None:
                attrs[ROLLOUT_FINISH_REASON] = reason
            if error is not None:
                attrs[error_attributes.ERROR_TYPE] = error
            cached = (
                attrs,
                {**attrs, GenAI.GEN_AI_TOKEN_TYPE: "input"},
                {**attrs, GenAI.GEN_AI_TOKEN_TYPE: "output"},
            )
            if len(self._label_sets) < 4096:  # bounded even if error types are not
                self._label_sets[key] = cached
        return cached

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
                [
                    {
                        "role": "user",
                        "parts": [{"type": "text", "content": record.prompt_text[:limit]}],
                    }
                ]
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


def _describe(error: BaseException) -> str:
    text = str(error)
    name = type(error).__qualname__
    return f"{name}: {text[:256]}" if text else name


def _mark_error(span: trace.Span, error: BaseException) -> None:
    """How request, batch and step spans all say they failed: ERROR status described as
    ``Type: message`` (message cut to 256 characters), and ``error.type``."""
    span.set_status(Status(StatusCode.ERROR, _describe(error)))
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


class StepTelemetry:
    """Step spans and the ``rollout.step.*`` histograms, under scope ``otel_rollout.steps``.

    A step belongs to the job, not to an engine: its scope names otel_rollout's step machinery
    whichever engines (if any) served its requests. One per pair of providers
    (:func:`step_telemetry`); its histograms are created on its first finished step.
    """

    def __init__(self, tracer: Tracer, meter: Meter, config: RolloutConfig) -> None:
        self.tracer = tracer
        self.meter = meter
        self.config = config
        self.log = LogOnce()
        self._instruments: StepInstruments | None = None

    @property
    def step_instruments(self) -> StepInstruments:
        if self._instruments is None:
            self._instruments = StepInstruments(self.meter, self.config)
        return self._instruments

    def start_step(self, step: int | None, attributes: Mapping[str, Any]) -> trace.Span:
        """The step span, started now in the current context; extra keys get the step prefix."""
        attrs = {
            k if k.startswith("rollout.") else ROLLOUT_STEP_ATTRIBUTE_PREFIX + k: v
            for k, v in attributes.items()
        }
        if step is not None:
            attrs[ROLLOUT_STEP] = step
        return self.tracer.start_span(STEP_SPAN_NAME, kind=SpanKind.INTERNAL, attributes=attrs)

    def finish_step(
        self,
        span: trace.Span,
        requests: int,
        stats: StepStats | None,
        error: BaseException | None,
        first: RequestRecord | None,
        missing_calls: int = 0,
    ) -> None:
        """Put a step's analysis on its span and into the step metrics, then end the span.

        ``first`` is one of the step's requests: its provider and model label the step's points.
        ``missing_calls`` remote calls never reported: the step is marked partial, and its
        figures are over the ``requests`` that are known.
        """
        try:
            with self.log.guard("step telemetry"):
                if error is not None:
                    _mark_error(span, error)
                span.set_attribute(STEP_REQUESTS, requests)
                if missing_calls:
                    span.set_attributes({STEP_PARTIAL: True, STEP_MISSING_CALLS: missing_calls})
                if stats is not None and first is not None:
                    span.set_attributes(step_span_attributes(stats))
                    self.step_instruments.record(
                        stats,
                        {
                            GenAI.GEN_AI_PROVIDER_NAME: first.provider,
                            GenAI.GEN_AI_REQUEST_MODEL: first.model,
                        },
                        trace.set_span_in_context(span),
                    )
        finally:
            with self.log.guard("step span"):
                span.end()


# --- which emitter steps use -----------------------------------------------------------------

STEP_SCOPE = "otel_rollout.steps"
_EMITTERS: list[Telemetry] = []
_EMITTERS_LOCK = threading.Lock()
_STEPS: list[tuple[Any, Any, StepTelemetry]] = []
"""One StepTelemetry per (tracer provider, meter provider) pair; ``None`` = the global ones."""


def create_telemetry(
    provider: str,
    tracer_provider: Any = None,
    meter_provider: Any = None,
    config: RolloutConfig | None = None,
) -> Telemetry:
    """An emitter on the given providers (the global ones when ``None``), scope ``otel_rollout.<provider>``.

    Each engine has its own instrumentation scope: on a shared meter the second engine's
    observable counters would be duplicates the SDK ignores.
    """
    scope = f"otel_rollout.{provider}"
    tracer = trace.get_tracer(
        scope, __version__, tracer_provider=tracer_provider, schema_url=SCHEMA_URL
    )
    meter = metrics.get_meter(
        scope, __version__, meter_provider=meter_provider, schema_url=SCHEMA_URL
    )
    return Telemetry(
        provider,
        tracer,
        meter,
        config or load_config(),
        tracer_provider=tracer_provider,
        scope=scope,
        meter_provider=meter_provider,
    )


def register(telemetry: Telemetry) -> None:
    """An instrumented engine: steps go to its providers (the most recently instrumented's)."""
    with _EMITTERS_LOCK:
        if telemetry in _EMITTERS:
            _EMITTERS.remove(telemetry)
        _EMITTERS.append(telemetry)


def unregister(telemetry: Telemetry) -> None:
    with _EMITTERS_LOCK:
        if telemetry in _EMITTERS:
            _EMITTERS.remove(telemetry)


def step_telemetry(tracer_provider: Any = None, meter_provider: Any = None) -> StepTelemetry:
    """The job's step telemetry on these providers (the global ones when ``None``)."""
    with _EMITTERS_LOCK:
        for tp, mp, steps in _STEPS:
            if tp is tracer_provider and mp is meter_provider:
                return steps
        tracer = trace.get_tracer(
            STEP_SCOPE, __version__, tracer_provider=tracer_provider, schema_url=SCHEMA_URL
        )
        meter = metrics.get_meter(
            STEP_SCOPE, __version__, meter_provider=meter_provider, schema_url=SCHEMA_URL
        )
        steps = StepTelemetry(tracer, meter, load_config(warn=False))
        _STEPS.append((tracer_provider, meter_provider, steps))
        return steps


def step_emitter() -> StepTelemetry:
    """Where steps go: the providers of the most recently instrumented engine, else the global
    ones (``rollout_step`` works without any instrumentor, as any OTel API user would)."""
    with _EMITTERS_LOCK:
        latest = _EMITTERS[-1] if _EMITTERS else None
    if latest is not None:
        return latest.steps
    return step_telemetry()
