"""Where records and steps become telemetry: :class:`Telemetry` (one per engine) and
:class:`StepTelemetry` (the job's steps), their lifecycle and transport.

Engine adapters build :class:`~otel_rollout.record.RequestRecord` objects and call
:meth:`Telemetry.emit`; the step scope hands its analysis to :meth:`StepTelemetry.finish_step`.
Spans are created once the request has finished, with the engine's own timestamps, so a span's
start and end are when the engine saw the request arrive and finish — not when we happened to
look. What each span and point carries is built in :mod:`otel_rollout.attributes`; the
instruments live in :mod:`otel_rollout.instruments`, in-flight accounting in
:mod:`otel_rollout.activity`, preset span ids in :mod:`otel_rollout.ids` (the tracer that uses them in
:mod:`otel_rollout.sdk_internals`), the background
queue in :mod:`otel_rollout.emitter`.

Why one module of this size: request and step telemetry share the provider resolution, the
scopes and the emitter wiring; everything else was moved out (issue #27).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from opentelemetry import context as otel_context
from opentelemetry import metrics, trace
from opentelemetry.metrics import CallbackOptions, Meter, Observation
from opentelemetry.semconv._incubating.attributes import gen_ai_attributes as GenAI
from opentelemetry.semconv.attributes import error_attributes
from opentelemetry.trace import (
    NonRecordingSpan,
    SpanContext,
    SpanKind,
    Status,
    StatusCode,
    TraceFlags,
    Tracer,
)

from otel_rollout import sampling
from otel_rollout.activity import EngineActivity, meter_observers
from otel_rollout.attributes import (
    base_attributes,
    describe_error,
    engine_attributes,
    metric_attribute_sets,
    request_span_attributes,
    step_phase_attributes,
    step_span_attributes,
)
from otel_rollout.config import RolloutConfig, load_config
from otel_rollout.context import StepView, step_view
from otel_rollout.emitter import PACE_WAIT_S, Emitter, Pacer, before_flush, register_exit_drain
from otel_rollout.guard import LogOnce
from otel_rollout.ids import PresetIds
from otel_rollout.instruments import LabelSets, RequestInstruments, StepInstruments
from otel_rollout.ranks import job_run_id
from otel_rollout.replicas import process_replica
from otel_rollout.rl_conventions import loop_attributes, phase_span_name
from otel_rollout.sampling import SamplingPolicy
from otel_rollout.sdk import drain_before_provider_flush
from otel_rollout.sdk_internals import preset_tracer
from otel_rollout.semconv import (
    BATCH_SPAN_NAME,
    EVENT_FIRST_TOKEN,
    EVENT_SCHEDULED,
    METRIC_STEP_REQUESTS_DONE,
    METRIC_STEP_REQUESTS_STARTED,
    METRIC_TELEMETRY_DROPPED,
    PHASE_NAME,
    PHASE_SPAN_NAME,
    RL_LOOP_SPAN_NAME,
    RL_MODEL_NAME,
    ROLLOUT_BATCH_SIZE,
    ROLLOUT_DROP_REASON,
    ROLLOUT_STEP,
    ROLLOUT_STEP_ATTRIBUTE_PREFIX,
    ROLLOUT_STEP_RANK,
    ROLLOUT_STEP_RANKS,
    STEP_MISSING_CALLS,
    STEP_PARTIAL,
    STEP_REQUESTS,
    STEP_SPAN_NAME,
)
from otel_rollout.version import __version__
from otel_rollout.versions import WeightVersions

if TYPE_CHECKING:
    from opentelemetry.context import Context

    from otel_rollout.analysis import StepStats
    from otel_rollout.ranks import SharedStep
    from otel_rollout.record import RequestRecord

SCHEMA_URL = "https://opentelemetry.io/schemas/1.37.0"
_NO_SPAN = otel_context.Context()
"""The context of points whose span was given up at exit: no exemplar names a span that never was."""
_NONE_WAITING: set[int] = set()
"""What :meth:`Telemetry._sample` returns when no record waits (never written to)."""
_WAITING_HOOKED: list[bool] = []


def _hook_flushes() -> None:
    """Once, when requests first wait in a step: every flush and the exit decide for them first
    (:func:`otel_rollout.sampling.release_all`), so a provider's own ``force_flush`` delivers
    every record taken, in inline emission too."""
    _WAITING_HOOKED.append(True)
    before_flush(sampling.release_all)
    register_exit_drain()
    drain_before_provider_flush()


def _instrument(name: str) -> Any:
    """``Telemetry.<name>``: the request instrument of that name (read and replaced in place)."""
    return property(
        lambda self: getattr(self.instruments, name),
        lambda self, value: setattr(self.instruments, name, value),
        doc=f"The ``{name}`` instrument of :class:`~otel_rollout.instruments.RequestInstruments`.",
    )


def _pace_every() -> int:
    """Spans between two drains of the tracer provider: a quarter of the batch queue."""
    try:
        size = int(os.environ.get("OTEL_BSP_MAX_QUEUE_SIZE", "") or 2048)
    except ValueError:
        size = 2048
    return max(1, size // 4)


class Telemetry:
    """An engine's telemetry: its request spans, metric points, batch spans and in-flight state.

    One per instrumentor (one engine kind), on the providers that instrumentor was given; its
    request instruments are created once, here, never per request. Its steps go to the job's
    :class:`StepTelemetry` on the same providers (:attr:`steps`).

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
        self._policy: tuple[RolloutConfig, SamplingPolicy] | None = None
        self._tracer_provider = tracer_provider
        self._meter_provider = meter_provider
        self._meter = meter
        self._own_steps: StepTelemetry | None = None
        self._scope = scope
        self._engines: dict[str, EngineActivity] = {}
        self._engines_lock = threading.Lock()
        self._request_tracer, self._preset = preset_tracer(tracer)
        self._emitter: Emitter | None = None
        self._inline_pacer: Pacer | None = None
        self._emitter_lock = threading.Lock()
        self._label_sets: dict[tuple[str, str, str | None, str | None], LabelSets] = {}
        self.instruments = RequestInstruments(meter, config)
        self._pace_spans = _pace_every()  # read once: an environment read costs ~3 µs a call
        meter_observers(meter).members.add(self)

    duration = _instrument("duration")
    ttft = _instrument("ttft")
    tpot = _instrument("tpot")
    tokens = _instrument("tokens")
    queue_time = _instrument("queue_time")
    dropped = _instrument("dropped")

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

    def engine_activity(self, model: str) -> EngineActivity:
        """The in-flight and held state of the engine serving ``model``."""
        activity = self._engines.get(model)
        if activity is None:
            with self._engines_lock:
                activity = self._engines.setdefault(model, EngineActivity())
        return activity

    def requests_started(
        self, model: str, operation: str, count: int = 1, ctx: Context | None = None
    ) -> int | None:
        """``count`` requests entered the engine; returns their start stamp, for
        :meth:`requests_ended` (the age of the oldest request in flight). The open step of
        ``ctx`` (the current context by default) counts them as started (its live progress)."""
        with self.log.guard("in-flight accounting"):
            view = step_view(ctx)  # the hand-over asks again: the same context, looked up once
            if view.step is not None:  # its live progress, and its sampling's count
                view.step.requests_started(count)
            elif view.number is not None and not self._sampling.keeps_all:
                # a step open in another process
                sampling.remote_state(view.number).requests_started(count)
            return self.engine_activity(model).change(count, operation)
        return None

    def requests_ended(
        self, model: str, operation: str, count: int = 1, started_ns: int | None = None
    ) -> None:
        with self.log.guard("in-flight accounting"):
            self.engine_activity(model).change(-count, operation, started_ns)

    def engine_progressed(self) -> None:
        """An engine loop of this kind produced output (a vLLM engine step): each engine of this
        telemetry is generating. The engine loop does not say which model it serves; a process
        runs one engine in RL rollouts, and with two, output of one counts for both."""
        for activity in list(self._engines.values()):
            activity.progressed()

    def activities(self) -> list[tuple[str, EngineActivity]]:
        """Each engine (model) this telemetry has seen, with its in-flight state."""
        return list(self._engines.items())

    def _stamp_weight_versions(self, records: Sequence[RequestRecord]) -> None:
        """Each request's weight version: the one its engine ran when the request arrived,
        unless the engine said itself which versions generated it (source ``engine``).

        Only engines of this process that saw a version change stamp their requests; a record of
        a client call to a remote server (no engine here) stays without one.
        """
        if not WeightVersions.changed_anywhere:
            return  # no weight update in this process (yet): no engine to ask
        versioned = {model for model, a in list(self._engines.items()) if a.weights.seen}
        if not versioned:
            return  # no engine here changed weights: nothing per record (10,000 after a generate)
        for record in records:
            if record.model in versioned and record.weight_version_source is None:
                found = self._engines[record.model].weights.lookup(record.arrival_ns)
                if found is not None:
                    record.weight_version, record.weight_version_source = found

    def _base_attributes(self, model: str, operation: str) -> dict[str, str]:
        return base_attributes(self.provider, model, operation)

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
                        mark_error(span, error)
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
            self._stamp_weight_versions(records)
            view = step_view(parent)  # once per hand-over: its step, number and collectors
            here = process_replica()
            for record in records:
                record.step = view.number
                if record.replica is None:
                    record.replica = here
            if capacity <= 0 or self._preset is None:
                waiting = self._sample(records, parent, view)
                self._emit_inline(records, parent, view.collectors, waiting)
                return
            self._assign_ids(records, parent)
            waiting = self._sample(records, parent, view)
            for collector in view.collectors:
                for record in records:
                    collector.observe(record)
            if waiting:
                records = [r for r in records if id(r) not in waiting]
            self._submit(records, parent)

    def _submit(self, records: Sequence[RequestRecord], parent: Context) -> None:
        """Records decided and observed by their step: to the emitter (or made inline)."""
        capacity = self.config.emit_queue
        if capacity <= 0 or self._preset is None:
            self._emit_inline(records, parent, ())
            return
        emitter = self._emitter or self._start_emitter()
        emitter.capacity = capacity
        refused = emitter.submit(records, parent)
        if refused:
            # The queue is full: these records lose their spans, never their counts. Metric
            # points cost CPU only, so the caller records them now (~10 µs each).
            for record in records[len(records) - refused :]:
                self._record_points(record, _NO_SPAN)

    def _submit_released(self, records: Sequence[RequestRecord], parent: Context) -> None:
        """A step decided for records that waited in it (:meth:`_sample`): guarded like any
        hand-over."""
        with self.log.guard("request telemetry"):
            self._submit(records, parent)

    @property
    def _sampling(self) -> SamplingPolicy:
        """The sampling settings of the current config (a re-instrumentation may replace it)."""
        cached, config = self._policy, self.config
        if cached is None or cached[0] is not config:
            policy = SamplingPolicy(
                config.sample_rate,
                config.tail_quantile,
                config.sample_min_step,
                config.sample_slowest,
            )
            cached = self._policy = (config, policy)
        return cached[1]

    def _sample(
        self, records: Sequence[RequestRecord], parent: Context, view: StepView
    ) -> set[int]:
        """Step-aware sampling (:mod:`otel_rollout.sampling`): which of these spans are made.
        Decided here, in the caller, in the order the requests finished. Returns the ``id()`` of
        the records that wait in their step (its tail and slowest are decided at its end, then
        handed on); a waiting record of an earlier call decided now is handed on here."""
        policy = self._sampling
        if policy.keeps_all:
            return _NONE_WAITING
        state = sampling.state_of(view)
        if state is None:
            return _NONE_WAITING  # outside any step: every span
        waiting: set[int] = set()
        for record in records:
            if not state.holds:  # a step with no end here: decided at once
                record.kept = state.decide(record, policy)
                if record.kept is None:
                    record.span_id = 0  # no span: nothing may name one
                continue
            if not _WAITING_HOOKED:
                _hook_flushes()
            waiting.add(id(record))
            for decided in state.take(record, parent, self._submit_released, policy):
                if id(decided.record) in waiting:
                    waiting.discard(id(decided.record))  # one of these: made with them
                else:
                    decided.submit((decided.record,), decided.parent)  # an earlier call's
        return waiting

    def _resolve_proxy(self) -> None:
        """Made before the SDK was set up: once it is, the emitter gets a tracer of its own."""
        provider = self._tracer_provider or trace.get_tracer_provider()
        if self._scope is None or isinstance(provider, trace.ProxyTracerProvider):
            return
        real = trace.get_tracer(
            self._scope, __version__, tracer_provider=provider, schema_url=SCHEMA_URL
        )
        self._request_tracer, self._preset = preset_tracer(real)

    def _emit_inline(
        self,
        records: Sequence[RequestRecord],
        parent: Context,
        observers: Sequence[Any],
        waiting: set[int] = _NONE_WAITING,
    ) -> None:
        """``OTEL_ROLLOUT_EMIT_QUEUE=0`` (or a tracer whose ids cannot be preset): as it happens.
        Each record is observed by ``observers`` after its span exists (its ids are the span's);
        a ``waiting`` one is observed now and made when its step has decided for it."""
        every = self._pace_spans
        for done, record in enumerate(records, 1):
            if id(record) in waiting:
                pass
            elif record.kept is None:
                self._record_points(record, _NO_SPAN)
            else:
                self._emit(record, parent, self.tracer, None)
            for collector in observers:
                collector.observe(record)
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
                    pace_every=self._pace_spans,
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
                if spans and record.kept is not None:
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
            self.instruments.dropped.add(
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
        """Wait until every record handed to this emitter so far has its span and points (a
        step's waiting requests are decided now: kept)."""
        with self.log.guard("sampling release"):
            sampling.release_all()
        emitter = self._emitter
        return True if emitter is None else emitter.flush(timeout_s)

    def _emit(
        self,
        record: RequestRecord,
        parent: Context | None,
        tracer: Tracer,
        preset: PresetIds | None,
    ) -> None:
        if preset is not None:
            preset.trace_id, preset.span_id = record.trace_id, record.span_id
        span = tracer.start_span(
            f"{record.operation} {record.model}",
            context=parent,
            kind=SpanKind.INTERNAL,
            start_time=record.arrival_ns,
            attributes=self._span_attributes(record),
        )
        if preset is not None:
            preset.trace_id = preset.span_id = 0
        if record.scheduled_ns is not None:
            span.add_event(EVENT_SCHEDULED, timestamp=record.scheduled_ns)
        if record.first_token_ns is not None:
            span.add_event(EVENT_FIRST_TOKEN, timestamp=record.first_token_ns)
        if record.error is not None:
            mark_error(span, record.error)
        span.end(end_time=record.finish_ns)
        span_context = span.get_span_context()
        record.trace_id, record.span_id = span_context.trace_id, span_context.span_id
        self._record_points(record, trace.set_span_in_context(span, parent))

    def _record_points(self, record: RequestRecord, ctx: Context) -> None:
        """A request's metric points, in ``ctx`` (its span's: exemplars name it)."""
        self.instruments.record(record, self._metric_attributes(record), ctx)

    def _span_attributes(self, record: RequestRecord) -> dict[str, Any]:
        config = self.config
        return request_span_attributes(
            record,
            config.capture_content,
            config.content_max_length,
            config.gen_ai_latest,
        )

    def _metric_attributes(self, record: RequestRecord) -> LabelSets:
        """A request's metric label sets, built once per label combination (labels are bounded:
        model, operation, finish reason, error type), not three dicts per request."""
        error = type(record.error).__qualname__ if record.error is not None else None
        key = (record.model, record.operation, record.finish_reason, error)
        cached = self._label_sets.get(key)
        if cached is None:
            cached = metric_attribute_sets(self.provider, record, self.config.gen_ai_latest)
            if len(self._label_sets) < 4096:  # bounded even if error types are not
                self._label_sets[key] = cached
        return cached


def mark_error(span: trace.Span, error: BaseException) -> None:
    """How request, batch and step spans all say they failed: ERROR status described as
    ``Type: message`` (message cut to 256 characters), and ``error.type``."""
    span.set_status(Status(StatusCode.ERROR, describe_error(error)))
    span.set_attribute(error_attributes.ERROR_TYPE, type(error).__qualname__)


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
        self._progress_observed = False
        self._root_tracer: tuple[Tracer, PresetIds | None] | None = None
        """The step tracer with presettable ids: a shared step's root (:mod:`otel_rollout.ranks`)."""
        self._root_lock = threading.Lock()

    def observe_progress(self, progress: Callable[[], list[tuple[int | None, int, int]]]) -> None:
        """Once: gauges of the live progress of the steps open in this process (``progress``
        gives their (step, done, started)); the step number stays off the labels (bounded), so
        two overlapping steps add up."""
        if self._progress_observed:
            return
        self._progress_observed = True

        def done(options: CallbackOptions) -> Iterator[Observation]:
            yield Observation(sum(d for _, d, _ in progress()))

        def started(options: CallbackOptions) -> Iterator[Observation]:
            yield Observation(sum(s for _, _, s in progress()))

        self.meter.create_observable_gauge(
            METRIC_STEP_REQUESTS_DONE,
            callbacks=[done],
            unit="{request}",
            description="Requests of the steps open now that finished (in this process).",
        )
        self.meter.create_observable_gauge(
            METRIC_STEP_REQUESTS_STARTED,
            callbacks=[started],
            unit="{request}",
            description="Requests of the steps open now that entered an engine (in this process).",
        )

    @property
    def step_instruments(self) -> StepInstruments:
        if self._instruments is None:
            self._instruments = StepInstruments(self.meter, self.config)
        return self._instruments

    def start_step(
        self,
        step: int | None,
        attributes: Mapping[str, Any],
        start_ns: int | None = None,
        shared: SharedStep | None = None,
    ) -> trace.Span:
        """The step span in the current context, from ``start_ns`` (now); extra keys get the step
        prefix. ``shared``: every rank opens the step; rank 0's span is the shared trace's root
        (its ids preset), another rank's its child."""
        attrs = {
            k if k.startswith("rollout.") else ROLLOUT_STEP_ATTRIBUTE_PREFIX + k: v
            for k, v in attributes.items()
        }
        if step is not None:
            attrs[ROLLOUT_STEP] = step
        name = STEP_SPAN_NAME
        if self.config.rl_latest:  # the proposed rl.* conventions (otel_rollout.rl_conventions)
            name = RL_LOOP_SPAN_NAME
            attrs.update(loop_attributes(attrs, job_run_id(self.config.run_id)))
        if shared is None:
            return self.tracer.start_span(
                name, kind=SpanKind.INTERNAL, attributes=attrs, start_time=start_ns
            )
        attrs[ROLLOUT_STEP_RANK], attrs[ROLLOUT_STEP_RANKS] = shared.rank, shared.ranks
        root = SpanContext(
            shared.trace_id, shared.root_span_id, is_remote=True, trace_flags=TraceFlags(1)
        )
        if shared.rank != 0:
            parent = trace.set_span_in_context(NonRecordingSpan(root))
            return self.tracer.start_span(
                name, parent, SpanKind.INTERNAL, attrs, start_time=start_ns
            )
        with self._root_lock:
            if self._root_tracer is None:
                self._root_tracer = preset_tracer(self.tracer)
            tracer, preset = self._root_tracer
            if preset is not None:
                preset.trace_id, preset.span_id = shared.trace_id, shared.root_span_id
            try:  # a root: no parent, whatever is current
                return tracer.start_span(
                    name,
                    otel_context.Context(),
                    SpanKind.INTERNAL,
                    attrs,
                    start_time=start_ns,
                )
            finally:
                if preset is not None:
                    preset.trace_id = preset.span_id = 0

    def finish_step(
        self,
        span: trace.Span,
        requests: int,
        stats: StepStats | None,
        error: BaseException | None,
        first: RequestRecord | None,
        missing_calls: int = 0,
        phases: Mapping[str, float] | None = None,
        duration_s: float = 0.0,
        end_ns: int | None = None,
    ) -> None:
        """Put a step's analysis on its span and into the step metrics, then end the span.

        ``first`` is one of the step's requests: its provider and model label the step's points.
        ``missing_calls`` remote calls never reported: the step is marked partial, and its
        figures are over the ``requests`` that are known. ``phases``: the step's top-level phase
        totals (:mod:`otel_rollout.phases`), put on the span with the time they left uncovered.
        ``end_ns``: when the step's scope was left (what gathering its records took is not the
        step's time).
        """
        try:
            with self.log.guard("step telemetry"):
                if error is not None:
                    mark_error(span, error)
                span.set_attribute(STEP_REQUESTS, requests)
                span.set_attributes(step_phase_attributes(phases or {}, duration_s))
                if missing_calls:
                    span.set_attributes({STEP_PARTIAL: True, STEP_MISSING_CALLS: missing_calls})
                if self.config.rl_latest:
                    self.step_instruments.rl_loop_duration(duration_s)
                    if first is not None:
                        span.set_attribute(RL_MODEL_NAME, first.model)
                if stats is not None and first is not None:
                    span.set_attributes(step_span_attributes(stats))
                    self.step_instruments.record(
                        stats,
                        engine_attributes(first.provider, first.model),
                        trace.set_span_in_context(span),
                    )
        finally:
            with self.log.guard("step span"):
                span.end(end_time=end_ns)

    def start_phase(
        self,
        name: str,
        attributes: Mapping[str, Any],
        start_ns: int,
        tracer: Tracer | None = None,
    ) -> trace.Span:
        """A phase span (:mod:`otel_rollout.phases`) under the current span, from ``start_ns``;
        on ``tracer`` where the phase is another instrumentation's own (an engine operation)."""
        span_name = f"{PHASE_SPAN_NAME} {name}"
        if self.config.rl_latest:
            span_name = phase_span_name(name) or span_name
        return (tracer or self.tracer).start_span(
            span_name,
            kind=SpanKind.INTERNAL,
            attributes={**attributes, PHASE_NAME: name},
            start_time=start_ns,
        )

    def finish_phase(
        self,
        span: trace.Span,
        label: str,
        seconds: float,
        error: BaseException | None,
        end_ns: int,
    ) -> None:
        """Record a phase's duration (``label``: its bounded metric label) and end its span."""
        try:
            with self.log.guard("phase telemetry"):
                if error is not None:
                    mark_error(span, error)
                self.step_instruments.phase_duration.record(
                    seconds, {PHASE_NAME: label}, context=trace.set_span_in_context(span)
                )
        finally:
            with self.log.guard("phase span"):
                span.end(end_time=end_ns)


# --- which emitter steps use -----------------------------------------------------------------

STEP_SCOPE = "otel_rollout.steps"
_ENGINES: list[Telemetry] = []
_ENGINES_LOCK = threading.Lock()
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
    with _ENGINES_LOCK:
        if telemetry in _ENGINES:
            _ENGINES.remove(telemetry)
        _ENGINES.append(telemetry)


def unregister(telemetry: Telemetry) -> None:
    with _ENGINES_LOCK:
        if telemetry in _ENGINES:
            _ENGINES.remove(telemetry)


def engine_activities() -> list[tuple[str, str, EngineActivity]]:
    """(provider, model, activity) of every engine the instrumented engines of this process saw."""
    with _ENGINES_LOCK:
        members = list(_ENGINES)
    return [(t.provider, model, activity) for t in members for model, activity in t.activities()]


def engine_activity_of(provider: str, model: str) -> EngineActivity | None:
    """The activity of engine ``model`` under the newest instrumentation of ``provider``, made if
    it has served nothing yet (a framework that loads weights into an engine before its first
    request names them here); ``None`` where ``provider`` is not instrumented."""
    with _ENGINES_LOCK:
        members = [t for t in _ENGINES if t.provider == provider]
    return members[-1].engine_activity(model) if members else None


def step_telemetry(tracer_provider: Any = None, meter_provider: Any = None) -> StepTelemetry:
    """The job's step telemetry on these providers (the global ones when ``None``)."""
    with _ENGINES_LOCK:
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


def job_step_telemetry() -> StepTelemetry:
    """Where steps go: the providers of the most recently instrumented engine, else the global
    ones (``rollout_step`` works without any instrumentor, as any OTel API user would)."""
    with _ENGINES_LOCK:
        latest = _ENGINES[-1] if _ENGINES else None
    if latest is not None:
        return latest.steps
    return step_telemetry()
