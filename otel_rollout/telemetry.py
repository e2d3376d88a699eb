"""Record → span + metric points + step analytics: the single place where telemetry is made.

Engine adapters build :class:`~otel_rollout.record.RequestRecord` objects and call
:meth:`Telemetry.emit`; they never touch tracers, meters or exporters. Spans are created once the
request has finished, with the engine's own timestamps, so a span's start and end are when the
engine saw the request arrive and finish — not when we happened to look.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.metrics import CallbackOptions, Meter, Observation
from opentelemetry.semconv._incubating.attributes import gen_ai_attributes as GenAI
from opentelemetry.semconv._incubating.metrics import gen_ai_metrics
from opentelemetry.semconv.attributes import error_attributes
from opentelemetry.trace import SpanKind, Status, StatusCode, Tracer

from otel_rollout import semconv as R
from otel_rollout.config import RolloutConfig
from otel_rollout.record import RequestRecord
from otel_rollout.steps import StepScope, current_step, step_number

if TYPE_CHECKING:
    from opentelemetry.context import Context

_logger = logging.getLogger(__name__)

BATCH_SPAN_NAME = "rollout.batch"


class _Guard:
    """One site's reusable context manager: free on the way through, logs once on failure.

    A class rather than ``@contextmanager``: the guard sits on every request and every streamed
    chunk, and a generator-based context manager costs a generator object and two frames per use.
    """

    __slots__ = ("_owner", "_site")

    def __init__(self, owner: LogOnce, site: str) -> None:
        self._owner = owner
        self._site = site

    def __enter__(self) -> None:
        return None

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> bool:
        if exc_type is None or not issubclass(exc_type, Exception):
            return False
        self._owner._failed(self._site, (exc_type, exc, tb))
        return True  # our own telemetry failed; the engine's work must not notice


class LogOnce:
    """Logs the first failure of each telemetry site, then stays quiet.

    A broken exporter or meter would otherwise log once per request — thousands of lines per
    training step — and bury the one message that matters.
    """

    def __init__(self) -> None:
        self._seen: set[str] = set()
        self._lock = threading.Lock()
        self._guards: dict[str, _Guard] = {}

    def guard(self, site: str) -> _Guard:
        guard = self._guards.get(site)
        if guard is None:
            guard = self._guards.setdefault(site, _Guard(self, site))
        return guard

    def _failed(self, site: str, exc_info: Any) -> None:
        with self._lock:
            first = site not in self._seen
            self._seen.add(site)
        if first:
            _logger.warning(
                "otel_rollout: telemetry failed in %s; the request itself is unaffected. "
                "Further failures here are not logged.", site, exc_info=exc_info)


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
    """Instruments of one instrumentor (one engine kind), and the record → telemetry mapping."""

    def __init__(self, provider: str, tracer: Tracer, meter: Meter, config: RolloutConfig) -> None:
        self.provider = provider
        self.tracer = tracer
        self.config = config
        self.log = LogOnce()
        self._engines: dict[str, EngineActivity] = {}
        self._engines_lock = threading.Lock()
        self._auto_step = 0
        self.duration = meter.create_histogram(
            gen_ai_metrics.GEN_AI_SERVER_REQUEST_DURATION, unit="s",
            description="Generate request latency, arrival to last token, in the engine.",
            explicit_bucket_boundaries_advisory=config.latency_buckets)
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
            R.METRIC_QUEUE_TIME, unit="s", description="Arrival until the scheduler first ran it.",
            explicit_bucket_boundaries_advisory=config.latency_buckets)
        self.active = meter.create_up_down_counter(
            R.METRIC_ACTIVE, unit="{request}", description="Requests in flight in the engine now.")
        meter.create_observable_counter(
            R.METRIC_ENGINE_BUSY_TIME, callbacks=[self._observe_busy], unit="s",
            description="Time the engine had at least one request in flight.")
        meter.create_observable_counter(
            R.METRIC_ENGINE_IDLE_TIME, callbacks=[self._observe_idle], unit="s",
            description="Time the engine had no request in flight.")

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

    def _engine_attributes(self, model: str) -> dict[str, str]:
        return {GenAI.GEN_AI_PROVIDER_NAME: self.provider, GenAI.GEN_AI_REQUEST_MODEL: model}

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

        With ``OTEL_ROLLOUT_BATCH_AS_STEP`` and no enclosing step, the batch is also a step, so
        an unmodified training loop still gets step analytics. Opening and closing are guarded:
        a failing span processor must neither stop the call nor fail it after the engine ran.
        """
        step: StepScope | None = None
        span: trace.Span | None = None
        ctx = otel_context.get_current()
        with self.log.guard("batch span"):
            if self.config.batch_as_step and current_step() is None:
                self._auto_step += 1
                step = StepScope(self._auto_step, config=self.config)
                step.__enter__()
            span = self.tracer.start_span(
                BATCH_SPAN_NAME, kind=SpanKind.INTERNAL,
                attributes={**self._base_attributes(model, operation), R.ROLLOUT_BATCH_SIZE: size})
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
                        span.set_status(Status(StatusCode.ERROR, str(error)[:256]))
                        span.set_attribute(error_attributes.ERROR_TYPE, type(error).__qualname__)
                    span.end()
            if step is not None:
                step.__exit__(type(error) if error else None, error,
                              error.__traceback__ if error else None)

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
            span.add_event(R.EVENT_FIRST_TOKEN, timestamp=record.first_token_ns)
        if record.error is not None:
            span.set_status(Status(StatusCode.ERROR, _describe(record.error)))
        span.end(end_time=record.finish_ns)

        ctx = trace.set_span_in_context(span, parent)
        attrs = self._base_attributes(record.model, record.operation)
        if record.finish_reason is not None:
            attrs[R.ROLLOUT_FINISH_REASON] = record.finish_reason
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
            step.observe(record, span.get_span_context())

    def _span_attributes(self, record: RequestRecord, parent: Context | None) -> dict[str, object]:
        attrs: dict[str, object] = {
            GenAI.GEN_AI_OPERATION_NAME: record.operation,
            GenAI.GEN_AI_PROVIDER_NAME: record.provider,
            GenAI.GEN_AI_REQUEST_MODEL: record.model,
            R.ROLLOUT_TIMING_SOURCE: record.timing_source,
        }
        optional: tuple[tuple[str, object], ...] = (
            (GenAI.GEN_AI_RESPONSE_ID, record.request_id),
            (GenAI.GEN_AI_REQUEST_MAX_TOKENS, record.max_tokens),
            (GenAI.GEN_AI_REQUEST_TEMPERATURE, record.temperature),
            (GenAI.GEN_AI_REQUEST_TOP_P, record.top_p),
            (GenAI.GEN_AI_REQUEST_CHOICE_COUNT, record.n),
            (GenAI.GEN_AI_USAGE_INPUT_TOKENS, record.prompt_tokens),
            (GenAI.GEN_AI_USAGE_OUTPUT_TOKENS, record.output_tokens),
            (R.ROLLOUT_CACHED_TOKENS, record.cached_tokens),
            (R.ROLLOUT_QUEUE_TIME, record.queue_time_s),
            (R.ROLLOUT_TTFT, record.ttft_s),
            (R.ROLLOUT_STEP, step_number(parent)),
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

    def _content_attributes(self, record: RequestRecord, attrs: dict[str, object]) -> None:
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
