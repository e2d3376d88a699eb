"""vLLM objects → request records, and the wrappers that collect them.

Only translation lives here: which vLLM field holds which time, on which clock, and how many
tokens. Spans and metrics are made by :class:`otel_rollout.telemetry.Telemetry`.

Timing exactness (see docs/ENGINES.md): with engine stats on (``AsyncLLM`` default, or
``LLM(disable_log_stats=False)``) every timestamp is vLLM's own ``RequestStateStats``. A plain
``LLM()`` keeps stats off; then arrival is the engine's ``arrival_time``, and first token and
finish are the engine-core timestamps of the step that produced them, read where the output
processor handles each step — exact to one engine step; queue time is not available. ``AsyncLLM``
with stats off (verl's server), and on vLLM 0.10–0.11 (which never fill ``RequestOutput.metrics``),
is timed the same way: its output handler is the same output processor.

Why one module of this size: the wrappers and the output-processor hooks share one per-request
state (stats on or off, ``n > 1`` children, the step stamps); the pure translation functions are
kept apart inside it and tested without an engine (``tests/core/test_extractors.py``).
"""

from __future__ import annotations

import functools
import importlib.util
import itertools
import time
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

from opentelemetry import context as otel_context
from opentelemetry import propagate

from otel_rollout.instrumentation import (
    Wrapper,
    argument,
    module_version,
    observing,
    should_observe,
    version_tuple,
)
from otel_rollout.propagation import server_context
from otel_rollout.record import (
    Clock,
    RequestRecord,
    model_label,
    normalize_finish_reason,
)
from otel_rollout.replicas import engine_replica
from otel_rollout.steps import batch_in_step
from otel_rollout.streams import StreamObserver, observe
from otel_rollout.telemetry import Telemetry
from otel_rollout.versions import token_versions

if TYPE_CHECKING:
    from opentelemetry.context import Context
    from vllm.outputs import RequestOutput

PROVIDER = "vllm"
_STEP_TIMES = otel_context.create_key("otel_rollout.vllm.step_times")


def model_name(engine: Any) -> str:
    config = getattr(engine, "model_config", None)
    if config is None:
        config = getattr(getattr(engine, "llm_engine", None), "model_config", None)
    return model_label(getattr(config, "served_model_name", None) or getattr(config, "model", None))


class StepTimes:
    """First-token and finish times per request id, read off the output processor.

    Only used while one offline call runs with engine stats off; it lives in that call's
    context and is dropped with it, so nothing is left behind between calls.
    """

    __slots__ = ("external", "arrival", "first", "finish")

    def __init__(self) -> None:
        # The engine core knows requests by an internal id (the caller's id plus a suffix).
        self.external: dict[str, str] = {}
        self.arrival: dict[str, float] = {}
        self.first: dict[str, float] = {}
        self.finish: dict[str, float] = {}


class AsyncStepTimes(StepTimes):
    """Engine step times of the ``AsyncLLM`` requests that vLLM does not time itself.

    ``AsyncLLM``'s output handler runs ``process_outputs`` in a task of its own, outside every
    request's context, so a request is *watched* here by the caller's request id for as long as
    its stream runs, and forgotten when it ends (however it ends): nothing outlives a stream.
    Two streams in flight with the same caller id share one entry (vLLM allows it from 0.12:
    it suffixes ids internally); their times then mix, and each span still gets a step bound.
    """

    __slots__ = ("watched", "engine_ids")

    def __init__(self) -> None:
        super().__init__()
        self.watched: dict[str, int] = {}
        self.engine_ids: dict[str, list[str]] = {}

    def watch(self, rid: str) -> None:
        self.watched[rid] = self.watched.get(rid, 0) + 1

    def forget(self, rid: str) -> tuple[float | None, float | None, float | None]:
        """Stop watching ``rid``: its (arrival wall time, first-token and finish step stamps)."""
        left = self.watched.get(rid, 0) - 1
        times = (self.arrival.get(rid), self.first.get(rid), self.finish.get(rid))
        if left > 0:
            self.watched[rid] = left
            return times
        self.watched.pop(rid, None)
        for engine_id in self.engine_ids.pop(rid, ()):
            self.external.pop(engine_id, None)
        self.arrival.pop(rid, None)
        self.first.pop(rid, None)
        self.finish.pop(rid, None)
        return times


ASYNC_TIMES = AsyncStepTimes()
"""The process's watched ``AsyncLLM`` requests (see :class:`AsyncStepTimes`)."""


def _per_request(params: Any, count: int) -> Iterable[Any]:
    """Each request's sampling parameters: one for all, or one each (missing ones ``None``).
    Resolved once per call: an ``isinstance`` against an ABC per request costs ~0.5 µs."""
    if params is None or not isinstance(params, Sequence):
        return itertools.repeat(params, count)
    return itertools.islice(itertools.chain(params, itertools.repeat(None)), count)


def _fill_sampling(record: RequestRecord, params: Any) -> None:
    if params is None:
        return
    record.max_tokens = getattr(params, "max_tokens", None)
    record.temperature = getattr(params, "temperature", None)
    record.top_p = getattr(params, "top_p", None)
    record.n = getattr(params, "n", None)


def choices_summary(
    choices: Sequence[Any],
) -> tuple[int, tuple[str, ...], int | None, int | None]:
    """(output tokens, finish reasons, draft tokens proposed, accepted) of a request's samples,
    in one pass (per request, on the caller's path after a generate returns).

    The speculative-decoding counts come from vLLM's per-sequence ``spec_decode_metrics``
    (``RequestSpecDecodeMetrics``: ``histogram[j]`` verify steps accepted ``j`` drafts). vLLM
    fills it only with ``per_request_spec_decode_metrics`` set and speculative decoding on;
    otherwise ``None``: not reported, never 0."""
    tokens = 0
    reasons: list[str] = []
    drafted = accepted = None
    for choice in choices:
        tokens += len(choice.token_ids)
        reason = normalize_finish_reason(choice.finish_reason)
        if reason:
            reasons.append(reason)
        metrics = getattr(choice, "spec_decode_metrics", None)
        if metrics is not None:
            drafted = (drafted or 0) + int(metrics.num_draft_tokens)
            accepted = (accepted or 0) + sum(j * n for j, n in enumerate(metrics.histogram))
    return tokens, tuple(reasons), drafted, accepted


def engine_weight_versions(choices: Sequence[Any]) -> tuple[tuple[str, int], ...]:
    """The engine's own weight versions over a finished request's output tokens: (version,
    tokens), in the order the engine generated them, summed over the request's samples.

    vLLM 0.32 labels every engine step with its weight version and sets, on a finished
    ``CompletionOutput``, ``weight_versions``: contiguous ``WeightVersionSpan(version, start,
    end)`` over output-token indexes. Empty on older releases and where nothing named the
    weights (:func:`~otel_rollout.versions.token_versions`)."""
    return token_versions(
        (span.version, span.start, span.end)
        for choice in choices
        for span in getattr(choice, "weight_versions", None) or ()
    )


def v0_times(stats: Any, finish: int) -> tuple[int | None, int | None, int]:
    """(first token, scheduled, finish) in epoch ns from the V0 engine's ``RequestMetrics``
    (vLLM ≤ 0.10 with ``VLLM_USE_V1=0``; the class is in ``vllm.sequence`` through 0.12): wall
    seconds, named ``first_token_time`` / ``first_scheduled_time`` / ``finished_time`` where V1's
    ``RequestStateStats`` has monotonic ``*_ts``. Reading V1's names off it raised, and every
    request span of the batch was lost after one warning. ``finish``: the fallback."""
    end = getattr(stats, "finished_time", None) or getattr(stats, "last_token_time", None)
    return (
        Clock.from_wall(getattr(stats, "first_token_time", None) or None),
        Clock.from_wall(getattr(stats, "first_scheduled_time", None) or None),
        Clock.from_wall(end) or finish,
    )


def record_from_output(
    output: RequestOutput,
    operation: str,
    model: str,
    clock: Clock,
    fallback_arrival_ns: int,
    fallback_finish_ns: int,
    times: StepTimes | None,
    capture: bool,
    output_tokens: int | None = None,
) -> RequestRecord:
    stats = getattr(output, "metrics", None)
    rid = output.request_id
    choices = output.outputs or ()
    arrival, finish = fallback_arrival_ns, fallback_finish_ns
    first = scheduled = None
    preemptions: int | None = None
    source = "observed"
    if stats is not None and getattr(stats, "arrival_time", None):
        arrival = Clock.from_wall(stats.arrival_time) or arrival
        source = "engine"
        if hasattr(stats, "first_token_time"):
            first, scheduled, finish = v0_times(stats, finish)
        else:
            first = clock.from_monotonic(stats.first_token_ts or None)
            scheduled = clock.from_monotonic(stats.scheduled_ts or None)
            finish = clock.from_monotonic(stats.last_token_ts or None) or finish
            preemptions = getattr(stats, "num_preemptions", None)
            if output_tokens is None and len(choices) <= 1:
                # With n > 1 the stats are the last-finishing sample's: count every sample.
                output_tokens = stats.num_generation_tokens
    elif times is not None:
        arrived, finished = times.arrival.get(rid), times.finish.get(rid)
        if arrived is not None and finished is not None:
            arrival = Clock.from_wall(arrived) or arrival
            first = clock.from_monotonic(times.first.get(rid))
            finish = clock.from_monotonic(finished) or finish
            source = "engine_steps"
    tokens, reasons, drafted, accepted = choices_summary(choices)
    prompt = output.prompt_token_ids
    record = RequestRecord(
        provider=PROVIDER,
        model=model,
        operation=operation,
        arrival_ns=arrival,
        finish_ns=finish if finish > arrival else arrival,
        first_token_ns=first,
        scheduled_ns=scheduled,
        request_id=rid,
        prompt_tokens=len(prompt) if prompt is not None else None,
        output_tokens=tokens if output_tokens is None else output_tokens,
        cached_tokens=getattr(output, "num_cached_tokens", None),
        finish_reasons=reasons,
        timing_source=source,
        preemptions=preemptions,
        spec_draft_tokens=drafted,
        spec_accepted_tokens=accepted,
    )
    record.set_engine_versions(engine_weight_versions(choices))
    if capture:
        record.prompt_text = output.prompt
        record.completion_texts = tuple(c.text for c in choices)
    return record


# --- offline: LLM.generate / LLM.chat -------------------------------------------------------


def offline_wrapper(telemetry: Telemetry, operation: str) -> Wrapper:
    """One parent span per call, one child per request with the engine's own timeline."""

    def wrapper(
        wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        if not should_observe():
            return wrapped(*args, **kwargs)
        model, replica = model_name(instance), engine_replica(instance)
        prompts = argument(args, kwargs, 0, "prompts", "messages")
        size = _batch_size(prompts, operation)
        params = argument(args, kwargs, 1, "sampling_params")
        clock = Clock()
        start_ns = clock.now_ns()
        times = StepTimes() if untimed(getattr(instance, "llm_engine", None)) else None
        with batch_in_step(telemetry, model, operation, size) as batch_ctx:
            ctx = (
                batch_ctx
                if times is None
                else otel_context.set_value(_STEP_TIMES, times, batch_ctx)
            )
            started = telemetry.requests_started(model, operation, size, batch_ctx)
            token = otel_context.attach(ctx)
            try:
                with observing():
                    outputs = wrapped(*args, **kwargs)
            except BaseException as exc:
                telemetry.emit(
                    RequestRecord(
                        provider=PROVIDER,
                        model=model,
                        operation=operation,
                        arrival_ns=start_ns,
                        finish_ns=clock.now_ns(),
                        error=exc,
                        timing_source="observed",
                        replica=replica,
                    ),
                    batch_ctx,
                )
                raise
            finally:
                otel_context.detach(token)
                telemetry.requests_ended(model, operation, size, started)
            end_ns = clock.now_ns()
            with telemetry.log.guard("vllm offline records"):
                records = []
                for output, request_params in zip(
                    outputs, _per_request(params, len(outputs)), strict=True
                ):
                    record = record_from_output(
                        output,
                        operation,
                        model,
                        clock,
                        start_ns,
                        end_ns,
                        times,
                        telemetry.config.capture_content,
                    )
                    _fill_sampling(record, request_params)
                    record.replica = replica
                    records.append(record)
                telemetry.emit_all(records, batch_ctx)
        return outputs

    return wrapper


def _batch_size(prompts: Any, operation: str) -> int:
    if prompts is None or isinstance(prompts, (str, dict)):
        return 1
    if operation == "chat":
        # One conversation is a list of message dicts; many are a list of such lists.
        return len(prompts) if prompts and isinstance(prompts[0], (list, tuple)) else 1
    try:
        return len(prompts)
    except TypeError:
        return 1


def _core_output_fields(out: Any) -> tuple[str, bool, bool]:
    """(engine request id, produced tokens this step, finished) of one ``EngineCoreOutput``.

    The one place the step loop reads engine fields: a rename in a future vLLM fails here, inside
    the guard, and costs the stats-off timing of that call — never the generate.
    """
    return out.request_id, bool(out.new_token_ids), out.finish_reason is not None


def add_request_wrapper(telemetry: Telemetry) -> Wrapper:
    """``OutputProcessor.add_request``: note the engine's arrival time for stats-off calls."""

    def wrapper(
        wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        times: StepTimes | None = otel_context.get_value(_STEP_TIMES)  # type: ignore[assignment]
        if times is not None or ASYNC_TIMES.watched:
            with telemetry.log.guard("vllm engine loop (add_request)"):
                request = argument(args, kwargs, 0, "request")
                # vLLM <= 0.12 has no external_req_id: an n > 1 sample is registered as
                # "<i>_<id>" with its parent request, whose id is the one the output carries.
                parent = argument(args, kwargs, 2, "parent_req")
                rid = getattr(request, "request_id", None)
                if rid is not None:
                    external = (
                        getattr(request, "external_req_id", None)
                        or getattr(parent, "request_id", None)
                        or rid
                    )
                    if times is None and external in ASYNC_TIMES.watched:
                        times = ASYNC_TIMES
                        ASYNC_TIMES.engine_ids.setdefault(external, []).append(rid)
                    if times is not None:
                        times.external[rid] = external
                        times.arrival.setdefault(
                            external, getattr(request, "arrival_time", None) or time.time()
                        )
        return wrapped(*args, **kwargs)

    return wrapper


def process_outputs_wrapper(telemetry: Telemetry) -> Wrapper:
    """``OutputProcessor.process_outputs``: the one loop that sees every request's every step."""

    def wrapper(
        wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        telemetry.engine_progressed()  # an engine step's outputs: the stall watch's sign of life
        times: StepTimes | None = otel_context.get_value(_STEP_TIMES)  # type: ignore[assignment]
        if times is None and ASYNC_TIMES.external:
            times = ASYNC_TIMES  # AsyncLLM's output handler: no request's context here
        if times is not None:
            with telemetry.log.guard("vllm engine loop (process_outputs)"):
                outputs = argument(args, kwargs, 0, "engine_core_outputs", default=())
                ts = argument(args, kwargs, 1, "engine_core_timestamp")
                now = ts if ts is not None else time.monotonic()
                first, finish, external = times.first, times.finish, times.external
                for out in outputs:
                    engine_id, produced, finished = _core_output_fields(out)
                    rid = external.get(engine_id)
                    if rid is None:
                        continue
                    if produced and rid not in first:
                        first[rid] = now
                    if finished:
                        finish[rid] = now
        return wrapped(*args, **kwargs)

    return wrapper


# --- async: AsyncLLM.generate -------------------------------------------------------------------


class AsyncRequest(StreamObserver):
    """State of one streamed request, ended once by the stream's :func:`observe`."""

    __slots__ = (
        "telemetry",
        "model",
        "request_id",
        "params",
        "parent",
        "clock",
        "start_ns",
        "first_ns",
        "tokens",
        "delta",
        "watched",
        "started",
        "replica",
    )

    def __init__(
        self,
        telemetry: Telemetry,
        model: str,
        request_id: str | None,
        params: Any,
        parent: Context,
        watched: bool = False,
        replica: str | None = None,
    ) -> None:
        self.ended = False  # StreamObserver's (its __init__ not called: a call less per stream)
        self.telemetry = telemetry
        self.model = model
        self.request_id = request_id
        self.params = params
        self.parent = parent
        self.clock = Clock()
        self.start_ns = self.clock.now_ns()
        self.first_ns: int | None = None
        self.tokens: dict[int, int] = {}
        kind = getattr(params, "output_kind", None)
        self.delta = getattr(kind, "name", "") == "DELTA"
        self.watched = watched  # in ASYNC_TIMES: the engine's step stamps are collected
        self.started: int | None = None  # the in-flight start stamp (Telemetry.requests_started)
        self.replica = replica

    def item(self, output: Any) -> bool:
        if getattr(output, "metrics", None) is not None:
            # The engine counts tokens and stamps the first one (its stats are on for the whole
            # stream): no chunk after this one needs to be seen, only the last.
            return False
        with self.telemetry.log.guard("vllm stream"):
            for choice in output.outputs or ():
                count = len(choice.token_ids)
                if count and self.first_ns is None:
                    self.first_ns = self.clock.now_ns()
                self.tokens[choice.index] = (
                    self.tokens.get(choice.index, 0) + count if self.delta else count
                )
        return True

    def finish(self, error: BaseException | None, last: Any) -> None:
        telemetry = self.telemetry
        telemetry.requests_ended(self.model, "text_completion", 1, self.started)
        try:
            self._emit(error, last)
        finally:
            if self.watched and self.request_id is not None:
                ASYNC_TIMES.forget(self.request_id)

    def _emit(self, error: BaseException | None, last: Any) -> None:
        telemetry = self.telemetry
        with telemetry.log.guard("vllm stream"):
            now = self.clock.now_ns()
            if last is not None:
                record = record_from_output(
                    last,
                    "text_completion",
                    self.model,
                    self.clock,
                    self.start_ns,
                    now,
                    ASYNC_TIMES if self.watched else None,
                    telemetry.config.capture_content and not self.delta,
                    output_tokens=sum(self.tokens.values()) if self.tokens else None,
                )
                if record.timing_source == "observed":
                    record.first_token_ns = self.first_ns
            else:
                record = RequestRecord(
                    provider=PROVIDER,
                    model=self.model,
                    operation="text_completion",
                    arrival_ns=self.start_ns,
                    finish_ns=now,
                    request_id=self.request_id,
                    timing_source="observed",
                )
            if error is not None:
                record.error = error
                if record.timing_source == "engine" and last is not None and not last.finished:
                    record.finish_ns = max(record.arrival_ns, now)
            _fill_sampling(record, self.params)
            record.replica = self.replica
            telemetry.emit(record, self.parent)


def async_generate_wrapper(telemetry: Telemetry) -> Wrapper:
    """One span per streamed request, in the caller's context, ended when the stream ends."""

    def wrapper(
        wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        if not should_observe():
            return wrapped(*args, **kwargs)
        if kwargs.get("trace_headers") is None and _tracing_enabled(instance):
            carrier: dict[str, str] = {}
            propagate.inject(carrier)
            kwargs = {**kwargs, "trace_headers": carrier}
        stream = wrapped(*args, **kwargs)
        model = model_name(instance)
        params = argument(args, kwargs, 1, "sampling_params")
        request_id = argument(args, kwargs, 2, "request_id")
        # The generator's body (and so the engine's add_request) runs at the first iteration.
        watched = isinstance(request_id, str) and untimed(instance)
        if watched:
            ASYNC_TIMES.watch(request_id)
        parent = otel_context.get_current()
        observer = AsyncRequest(
            telemetry, model, request_id, params, parent, watched, engine_replica(instance)
        )
        observer.started = telemetry.requests_started(model, "text_completion", 1, parent)
        return observe(stream, observer)

    return wrapper


def untimed(engine: Any) -> bool:
    """vLLM does not time this engine's requests: stats off (``LLM()``'s default, verl's
    server), or vLLM 0.10–0.11, which never fill ``RequestOutput.metrics`` even with stats on."""
    return not getattr(engine, "log_stats", False) or not _fills_metrics()


@functools.cache
def _fills_metrics() -> bool:
    """Once per process (asked per request; a version parse costs microseconds)."""
    release = version_tuple(module_version("vllm") or "")
    return release is None or release >= (0, 12)


def _tracing_enabled(engine: Any) -> bool:
    """Inject only where vLLM would use the headers; elsewhere it logs that tracing is off."""
    config = getattr(engine, "observability_config", None)
    return bool(getattr(config, "otlp_traces_endpoint", None))


# --- OpenAI-compatible server: the HTTP request's trace context ---------------------------------

SERVING_HOOKS = (
    ("vllm.entrypoints.serve.engine.serving", "BaseServing"),  # newer; checked on 0.32.0
    ("vllm.entrypoints.openai.serving_engine", "OpenAIServing"),  # older; checked on 0.12.0
)
"""Where the OpenAI server's ``_get_trace_headers(headers)`` lives, newest layout first."""


def serving_hook() -> tuple[str, str]:
    """(module, "Owner._get_trace_headers") of the installed vLLM's OpenAI server.

    Called once vLLM is imported; ``find_spec`` imports only the parent packages. Neither found:
    the newest is returned, and reported missing once like any other target.
    """
    for module, owner in SERVING_HOOKS:
        try:
            if importlib.util.find_spec(module) is not None:
                return module, f"{owner}._get_trace_headers"
        except (ImportError, ValueError):
            continue
    module, owner = SERVING_HOOKS[0]
    return module, f"{owner}._get_trace_headers"


def server_headers_wrapper(telemetry: Telemetry) -> Wrapper:
    """``_get_trace_headers(headers)`` of the OpenAI server: the caller's context for the request.

    (``BaseServing`` in vLLM 0.32, ``OpenAIServing`` in older releases: :func:`serving_hook`.)

    The OpenAI server calls this with the HTTP request's headers in every endpoint (completions,
    chat, responses, …), in the request's own task, just before it calls
    ``engine_client.generate`` — the one place a server request's headers meet the engine call.
    vLLM itself keeps only ``traceparent``/``tracestate`` (never ``baggage``), and drops even
    those when its own tracing is off (0.32: in ``AsyncLLM.add_request``; 0.12: right in this
    method), so the headers are read here, before vLLM looks at them: their context (the
    caller's span and ``rollout.step`` baggage) is attached unless something — ASGI/FastAPI
    instrumentation — already attached a span (see :func:`server_context`). The
    ``AsyncLLM.generate`` wrapper then takes it as the request span's parent.

    The context stays attached for the rest of the request's task and is not detached here:
    vLLM runs each request handler in a task of its own (``with_cancellation``, or uvicorn's
    per-request task), so it ends with the request, as a server span's context would. What vLLM
    returns is returned unchanged.
    """

    def wrapper(
        wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        if should_observe():
            with telemetry.log.guard("vllm server context"):
                ctx = server_context(argument(args, kwargs, 0, "headers"))
                if ctx is not None:
                    otel_context.attach(ctx)
        return wrapped(*args, **kwargs)

    return wrapper


# --- engine construction: our stat logger, only where the engine's stats are on ------------------


@functools.lru_cache(maxsize=8)
def _takes_stat_loggers(init: Callable[..., Any]) -> bool:
    import inspect

    try:
        return "stat_loggers" in inspect.signature(init).parameters
    except (TypeError, ValueError):
        return False


OFFLINE_STAT_LOGGERS = (0, 12)
"""The first vLLM whose offline ``LLMEngine`` accepts stat loggers (0.11's raises
``NotImplementedError`` for any given)."""


def offline_takes_stat_loggers() -> bool:
    release = version_tuple(module_version("vllm") or "")
    return release is not None and release >= OFFLINE_STAT_LOGGERS


def engine_init_wrapper(telemetry: Telemetry, watch: Wrapper, *, offline: bool = False) -> Wrapper:
    """``AsyncLLM.__init__`` and (``offline``) ``LLMEngine.__init__``: the global-provider watch,
    and :mod:`otel_rollout.vllm.stat_logger` added to the engine's own ``stat_loggers`` argument
    (vLLM's interface for custom stat loggers) when the engine's stats are on. An offline engine
    gets it from vLLM 0.12 (:data:`OFFLINE_STAT_LOGGERS`): 0.11's refuses any stat logger.

    Never when they are off: vLLM turns stats on for an engine given any stat logger (and for
    every ``AsyncLLM`` when a ``vllm.stat_logger_plugins`` entry point is installed, which is why
    ours is not one), and observing must not change the engine. Stats-off engines (verl's, and
    ``LLM()`` by default) keep their per-request engine-step timing and get no per-step engine
    figures.
    """

    def wrapper(
        wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        with telemetry.log.guard("vllm stat logger set-up"):
            if (
                argument(args, kwargs, 2, "log_stats") is True
                and len(args) <= 3  # stat_loggers, if given, comes as a keyword
                and _takes_stat_loggers(wrapped)
                and (not offline or offline_takes_stat_loggers())
            ):
                from otel_rollout.vllm.stat_logger import RolloutStatLogger

                given = list(kwargs.get("stat_loggers") or [])
                if RolloutStatLogger not in given:
                    kwargs = {**kwargs, "stat_loggers": [*given, RolloutStatLogger]}
        return watch(wrapped, instance, args, kwargs)

    return wrapper
