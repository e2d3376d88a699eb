"""SGLang objects → request records, and the wrappers that collect them.

Only translation lives here: which ``meta_info`` field holds which time, on which clock, and how
many tokens. Spans and metrics are made by :class:`otel_rollout.telemetry.Telemetry`.

Every generate request SGLang serves in this process goes through
``TokenizerManager.generate_request`` (``Engine.generate``/``async_generate`` call it, as do the
HTTP server and verl's server adapter), so that is the one place requests are observed. The
``Engine`` wrappers only mark the call, so a batch gets its parent span; they never count, so a
request is never seen twice.

Clocks (measured on SGLang 0.5.23): SGLang stamps with ``time.perf_counter()`` and reports
*durations* (``e2e_latency``, ``first_token_latency``, ``queue_time``) as perf-counter differences,
and *timestamps* (``*_ts``, ``forward_entry_time``) already converted to wall-clock seconds by
SGLang's own per-process offset. Wall stamps go through :meth:`Clock.from_wall`, our own
observations through :meth:`Clock.now_ns`; durations are only ever added to one of those.

Timing exactness:

* ``enable_metrics=True`` (``rollout.timing.source = engine``): arrival is SGLang's
  ``request_received_ts``, finish is arrival + ``e2e_latency``, first token is arrival +
  ``first_token_latency`` — all the tokenizer manager's own stamps, exact. Queue time ends at the
  scheduler's ``forward_entry_time`` (its first forward pass), stamped in the scheduler process;
  its wall conversion may differ from the tokenizer's by microseconds.
* ``enable_metrics`` off, the default (``engine_latency``): only ``e2e_latency`` is reported, so
  the span's *duration* is exact but its placement is anchored on its finish: SGLang's
  ``response_sent_to_client_ts`` for a non-streamed request (exact to one event-loop wake-up), or
  when the stream yielded the final chunk (late by however long the consumer took to ask).
  A streamed request's first token is the first chunk's ``response_sent_to_client_ts``; a
  non-streamed one has none, and no queue time is available.
* A request that failed or was abandoned before its final chunk (``observed``): from the call to
  the failure, as seen at the engine's boundary.

Older releases (read off their wheels, docs/ENGINE_NOTES.md) name the same stamps otherwise, and
:data:`FIRST_TOKEN_SOURCES` / :data:`SCHEDULED_SOURCES` list every way each is read, newest
first: 0.5.5 gives the first token as ``prefill_finished_ts`` and the forward entry as
``decode_finished_ts − forward_time``; 0.5.6–0.5.8 give ``decode_throughput`` (completion tokens
per second after the first token: first token = ``decode_finished_ts − completion_tokens /
decode_throughput``) and ``inference_time``. Each is the engine's own stamp, exact to float
rounding, so the timing source stays ``engine``.

Why one module of this size: SGLang's fields, its two clocks and the wrappers that read them
change together from one SGLang release to the next; the pure translation (:func:`timeline`) is
kept apart inside it and tested without an engine (``tests/core/test_extractors.py``).
"""

from __future__ import annotations

import contextvars
import weakref
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from opentelemetry import context as otel_context
from opentelemetry import propagate

from otel_rollout.instrumentation import Wrapper, argument, should_observe
from otel_rollout.propagation import server_context
from otel_rollout.record import (
    Clock,
    RequestRecord,
    model_label,
    normalize_finish_reason,
)
from otel_rollout.replicas import engine_replica
from otel_rollout.sglang import scheduler_metrics
from otel_rollout.steps import batch_in_step
from otel_rollout.streams import StreamObserver, observe
from otel_rollout.telemetry import Telemetry
from otel_rollout.versions import token_versions

if TYPE_CHECKING:
    from contextlib import AbstractContextManager

    from opentelemetry.context import Context
    from sglang.srt.managers.io_struct import GenerateReqInput

PROVIDER = "sglang"
OPERATION = "text_completion"
_ENGINE_CALL = otel_context.create_key("otel_rollout.sglang.engine_call")


def model_name(manager: Any) -> str:
    return model_label(
        getattr(manager, "served_model_name", None) or getattr(manager, "model_path", None)
    )


def _seconds_ns(seconds: Any) -> int | None:
    """An engine duration (seconds) as nanoseconds; durations need no clock, only a unit."""
    return None if seconds is None else int(float(seconds) * 1e9)


# --- request shape ------------------------------------------------------------------------


def _parallel_samples(params: Any) -> int:
    if isinstance(params, Mapping):
        return int(params.get("n") or 1)
    if isinstance(params, list) and params and isinstance(params[0], Mapping):
        return int(params[0].get("n") or 1)
    return 1


def request_shape(obj: GenerateReqInput) -> tuple[int, bool]:
    """(engine requests, is a batch) of a not-yet-normalized ``GenerateReqInput``.

    SGLang only normalizes the object once its generator starts; this mirrors its rule
    (``_determine_batch_size`` + ``_handle_parallel_sampling``: ``n > 1`` turns a single prompt
    into a batch) without mutating it, so in-flight accounting can start at the call.
    """
    size, single = 1, True
    text, ids, embeds = obj.text, obj.input_ids, getattr(obj, "input_embeds", None)
    if text is not None:
        single = isinstance(text, str)
        size = 1 if single else len(text)
    elif ids is not None:
        single = len(ids) == 0 or isinstance(ids[0], int)
        size = 1 if single else len(ids)
    elif embeds:
        single = bool(embeds[0]) and isinstance(embeds[0][0], float)
        size = 1 if single else len(embeds)
    n = _parallel_samples(obj.sampling_params)
    return size * n, not single or n > 1


def _is_generate(obj: Any) -> bool:
    """Generate requests only: the same method also serves embeddings and rerank."""
    return any(cls.__name__ == "GenerateReqInput" for cls in type(obj).__mro__)


HEALTH_CHECK_RID_PREFIX = "HEALTH_CHECK"
"""SGLang's own probes (``sglang.srt.constants``): ``/health`` and ``/health_generate`` generate
one token under a request id with this prefix, and SGLang keeps them out of its own metrics."""


def is_health_check(obj: Any) -> bool:
    """SGLang's probe, not a rollout request: a router polling ``/health`` (sglang-router does,
    every worker, all the time) would otherwise add a request span and a count each time."""
    rid = getattr(obj, "rid", None)
    return isinstance(rid, str) and rid.startswith(HEALTH_CHECK_RID_PREFIX)


def _tracing_enabled(manager: Any) -> bool:
    """SGLang reads ``external_trace_header`` only with its tracing on; elsewhere leave it alone."""
    return bool(getattr(manager, "enable_trace", False))


# --- batches --------------------------------------------------------------------------------


class BatchScope:
    """``telemetry.batch()`` held open until a batch's last request ends, in a context of its own.

    A streamed batch outlives the call that started it, and may end in another task or at garbage
    collection; entering the batch (and any step it opens) in a copied context keeps the caller's
    context untouched meanwhile, and lets it be exited wherever the stream ends.
    """

    __slots__ = ("_ctx", "_cm", "parent", "_open", "_telemetry")

    def __init__(self, telemetry: Telemetry, model: str, size: int) -> None:
        self._telemetry = telemetry
        self._ctx = contextvars.copy_context()
        self._cm: AbstractContextManager[Context] = batch_in_step(telemetry, model, OPERATION, size)
        self.parent: Context = self._ctx.run(self._cm.__enter__)
        self._open = True

    def end(self, error: BaseException | None) -> None:
        if not self._open:
            return
        self._open = False
        with self._telemetry.log.guard("sglang batch"):
            if error is None:
                self._ctx.run(self._cm.__exit__, None, None, None)
            else:
                self._ctx.run(self._cm.__exit__, type(error), error, error.__traceback__)


FIRST_TOKEN_SOURCES: tuple[tuple[str, ...], ...] = (
    ("first_token_latency",),  # 0.5.23: a duration from request_received_ts
    ("prefill_finished_ts",),  # 0.5.5: a wall stamp
    ("decode_finished_ts", "decode_throughput", "completion_tokens"),  # 0.5.6-0.5.8
)
"""The ``meta_info`` keys each way of reading the first token needs (the contract test checks
that every release from 0.5.5 writes all the keys of one of them)."""
SCHEDULED_SOURCES: tuple[tuple[str, ...], ...] = (
    ("forward_entry_time",),  # 0.5.23: a wall stamp
    ("decode_finished_ts", "forward_time"),  # 0.5.5: finish wall stamp − forward duration
    ("decode_finished_ts", "inference_time"),  # 0.5.6-0.5.8
)
"""The same for the scheduler's forward entry (the end of the queue)."""


def _first_token_ns(meta: Mapping[str, Any], received: int) -> int | None:
    """The first token's epoch ns, by whichever of :data:`FIRST_TOKEN_SOURCES` the release wrote."""
    latency = _seconds_ns(meta.get("first_token_latency"))
    if latency is not None:
        return received + latency
    prefilled = Clock.from_wall(meta.get("prefill_finished_ts"))
    if prefilled is not None:
        return prefilled
    finished = Clock.from_wall(meta.get("decode_finished_ts"))
    throughput, tokens = meta.get("decode_throughput"), meta.get("completion_tokens")
    if finished is None or not throughput or not tokens:
        return None
    return finished - int(tokens / throughput * 1e9)  # decoding took tokens / throughput s


def _scheduled_ns(meta: Mapping[str, Any]) -> int | None:
    """The forward entry's epoch ns, by whichever of :data:`SCHEDULED_SOURCES` it has."""
    entry = Clock.from_wall(meta.get("forward_entry_time"))
    if entry is not None:
        return entry
    finished = Clock.from_wall(meta.get("decode_finished_ts"))
    forward = _seconds_ns(meta.get("forward_time"))
    if forward is None:
        forward = _seconds_ns(meta.get("inference_time"))
    return None if finished is None or forward is None else finished - forward


def timeline(
    meta: Mapping[str, Any],
    streamed: bool,
    call_ns: int,
    seen_ns: int | None,
    first_seen_ns: int | None,
    now_ns: int,
    error: BaseException | None,
) -> tuple[int, int, int | None, int | None, str]:
    """(arrival, finish, first token, scheduled, timing source) in epoch ns, from a request's
    final ``meta_info`` and what the stream observed (see the module doc for each source).

    ``call_ns``: when ``generate_request`` was called; ``seen_ns``: when the request's last chunk
    was seen; ``first_seen_ns``: its first token as the stream saw it (streamed requests).
    """
    e2e = _seconds_ns(meta.get("e2e_latency"))
    received = Clock.from_wall(meta.get("request_received_ts"))
    if error is None and e2e is not None and received is not None:
        return (
            received,
            received + e2e,
            _first_token_ns(meta, received),
            _scheduled_ns(meta),
            "engine",
        )
    if error is None and e2e is not None:
        sent = None if streamed else Clock.from_wall(meta.get("response_sent_to_client_ts"))
        finish = sent or seen_ns or now_ns
        return finish - e2e, finish, first_seen_ns, None, "engine_latency"
    return call_ns, now_ns, first_seen_ns, None, "observed"


def weight_versions(meta: Mapping[str, Any]) -> tuple[tuple[str, int], ...]:
    """The engine's own weight versions over a finished request's output tokens, (version,
    tokens) in order: ``meta_info["weight_versions"]`` (SGLang 0.5.23: ``{version, start, end}``
    over output-token indexes; a version change records the old one for every live request)."""
    spans = meta.get("weight_versions")
    if not isinstance(spans, list):
        return ()
    return token_versions(
        (str(s["version"]), int(s["start"]), int(s["end"]))
        for s in spans
        if isinstance(s, Mapping) and {"version", "start", "end"} <= s.keys()
    )


# --- one generate_request call --------------------------------------------------------------


class _Request:
    """What the stream has shown of one engine request so far."""

    __slots__ = ("meta", "text", "seen_ns", "first_ns", "done")

    def __init__(self) -> None:
        self.meta: Mapping[str, Any] = {}
        self.text: str | None = None
        self.seen_ns: int | None = None
        self.first_ns: int | None = None
        self.done = False


class RequestGroup(StreamObserver):
    """The requests of one ``generate_request`` call; each is emitted as soon as it finishes.

    A non-streamed call is read with a single ``__anext__`` (``Engine.generate``, verl) and its
    generator is never exhausted, so a request cannot wait for the stream's end: it is emitted
    when its chunk carries a finish reason. The stream's end only settles what is left.
    """

    def __init__(
        self,
        telemetry: Telemetry,
        manager: Any,
        obj: GenerateReqInput,
        model: str,
        parent: Context,
        batch: BatchScope | None,
        expected: int,
    ) -> None:
        super().__init__()
        self.telemetry = telemetry
        self.model = model
        self.replica = engine_replica(manager)
        self.parent = parent
        self.batch = batch
        self.expected = expected
        self.open = expected
        self.clock = Clock()
        self.start_ns = self.clock.now_ns()
        self.streamed = bool(getattr(obj, "stream", False))
        # Held before SGLang normalizes (and may replace) them, for per-request attributes.
        self.params = obj.sampling_params
        self.texts = obj.text
        self.obj = obj  # its rids exist only once SGLang has normalized it
        self.samples = _parallel_samples(obj.sampling_params)
        self.capture = telemetry.config.capture_content and not (
            self.streamed and getattr(manager, "incremental_streaming_output", False)
        )
        self.requests: dict[int, _Request] = {}
        self.finished = 0
        self.settled = False
        self.started: int | None = None  # the in-flight start stamp (Telemetry.requests_started)

    # StreamObserver ---------------------------------------------------------------------------

    def item(self, item: Any) -> bool:
        """Every chunk is seen: SGLang's chunks each carry one request's progress."""
        with self.telemetry.log.guard("sglang stream"):
            now = self.clock.now_ns()
            if isinstance(item, list):  # a non-streamed batch answers all at once
                for index, out in enumerate(item):
                    self._see(index, out, now)
                self._settle(None, unseen=False)
            elif isinstance(item, Mapping):
                self._see(int(item.get("index", 0)), item, now)
                if self.finished >= self.expected:
                    self._settle(None, unseen=False)
        return True

    def finish(self, error: BaseException | None, last: Any) -> None:
        with self.telemetry.log.guard("sglang stream"):
            self._settle(error, unseen=error is not None)

    # ------------------------------------------------------------------------------------------

    def _see(self, index: int, out: Mapping[str, Any], now: int) -> None:
        state = self.requests.setdefault(index, _Request())
        if state.done:
            return
        meta = out.get("meta_info") or {}
        state.meta = dict(meta)  # SGLang reuses its output objects between chunks
        state.seen_ns = now
        if self.streamed and state.first_ns is None and meta.get("completion_tokens"):
            # SGLang stamps when it sent a stream's first chunk; ours is the fallback.
            state.first_ns = Clock.from_wall(meta.get("response_sent_to_client_ts")) or now
        if self.capture:
            state.text = out.get("text")
        if meta.get("finish_reason") is not None:
            state.done = True
            self.finished += 1
            self._emit(index, state, None)

    def _settle(self, error: BaseException | None, unseen: bool) -> None:
        """End the call: emit what is still open, give back in-flight slots, close the batch."""
        if self.settled:
            return
        self.settled = True
        indices = set(self.requests)
        if unseen:
            indices.update(range(self.expected))
        for index in sorted(indices):
            state = self.requests.setdefault(index, _Request())
            if not state.done:
                state.done = True
                self._emit(index, state, error)
        if self.open > 0:
            self.telemetry.requests_ended(self.model, OPERATION, self.open, self.started)
            self.open = 0
        if self.batch is not None:
            self.batch.end(error)

    def _emit(self, index: int, state: _Request, error: BaseException | None) -> None:
        if self.open > 0:
            self.telemetry.requests_ended(self.model, OPERATION, 1, self.started)
            self.open -= 1
        record = self._record(index, state, error)
        self.telemetry.emit(record, self.parent)

    def _record(self, index: int, state: _Request, error: BaseException | None) -> RequestRecord:
        meta = state.meta
        now = self.clock.now_ns()
        arrival, finish, first, scheduled, source = timeline(
            meta, self.streamed, self.start_ns, state.seen_ns, state.first_ns, now, error
        )
        reason = normalize_finish_reason(meta.get("finish_reason"))
        record = RequestRecord(
            provider=PROVIDER,
            model=self.model,
            operation=OPERATION,
            arrival_ns=arrival,
            finish_ns=max(finish, arrival),
            first_token_ns=first,
            scheduled_ns=scheduled,
            request_id=meta.get("id") or self._rid(index),
            prompt_tokens=meta.get("prompt_tokens"),
            output_tokens=meta.get("completion_tokens"),
            cached_tokens=meta.get("cached_tokens"),
            # SGLang's retractions (KV pool full: the request freed and recomputed later) are what
            # vLLM calls preemptions; meta_info counts them per request in 0.5.23 (not in 0.5.8 or older).
            preemptions=meta.get("num_retractions"),
            # with speculative decoding on (0.5.23): draft tokens proposed and accepted
            spec_draft_tokens=meta.get("spec_num_proposed_drafts"),
            spec_accepted_tokens=meta.get("spec_num_correct_drafts"),
            finish_reasons=(reason,) if reason else (),
            error=error,
            timing_source=source,
            replica=self.replica,
        )
        record.set_engine_versions(weight_versions(meta))
        self._fill_request(record, index, state)
        return record

    def _rid(self, index: int) -> str | None:
        rids = getattr(self.obj, "rid", None)
        if isinstance(rids, str):
            return rids if self.expected == 1 else None
        if isinstance(rids, list) and self.samples == 1 and index < len(rids):
            return str(rids[index])
        return None

    def _fill_request(self, record: RequestRecord, index: int, state: _Request) -> None:
        """Sampling parameters and (opt-in) content of request ``index``.

        With ``n > 1`` SGLang expands prompt ``i`` into requests ``i*n … i*n+n-1``.
        """
        prompt = index // self.samples
        params = self.params
        if isinstance(params, list):
            params = params[prompt] if prompt < len(params) else None
        if isinstance(params, Mapping):
            record.max_tokens = params.get("max_new_tokens")
            record.temperature = params.get("temperature")
            record.top_p = params.get("top_p")
            record.n = params.get("n")
        if self.capture:
            texts = self.texts
            if isinstance(texts, list):
                texts = texts[prompt] if prompt < len(texts) else None
            record.prompt_text = texts if isinstance(texts, str) else None
            record.completion_texts = (state.text,) if isinstance(state.text, str) else ()


# --- wrappers -------------------------------------------------------------------------------


def output_stamp(manager: Any) -> Callable[[], float | None]:
    """Reads the tokenizer manager's own stamp of the last output it received from the
    scheduler (``last_receive_tstamp``, wall seconds; every release from 0.4.9 keeps it). A
    non-streamed request reaches our wrapper only when it finishes, but the scheduler sends its
    tokens on every ``SGLANG_FORCE_STREAM_INTERVAL`` (50) steps, so this stamp is the engine's
    sign of generating between finishes (the stall watch's probe)."""
    ref = weakref.ref(manager)

    def stamp() -> float | None:
        live = ref()
        value = getattr(live, "last_receive_tstamp", None)
        return float(value) if isinstance(value, (int, float)) else None

    return stamp


def generate_request_wrapper(telemetry: Telemetry) -> Wrapper:
    """``TokenizerManager.generate_request``: one span per engine request, in the caller's context.

    Inside an ``Engine`` call a batch also gets its parent span. From SGLang's HTTP server (native
    ``/generate`` and the OpenAI endpoints alike) the second argument is the FastAPI request:
    its headers' context — the caller's span and ``rollout.step`` baggage — is the parent
    wherever the current context lacks them (see :func:`server_context`: a server span that
    ASGI/FastAPI instrumentation attached is kept). SGLang itself reads ``traceparent`` only
    with its own tracing on, and never ``baggage``. ``Engine`` calls pass ``None``.
    """

    def wrapper(
        wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        obj = argument(args, kwargs, 0, "obj")
        if obj is None or not should_observe() or not _is_generate(obj) or is_health_check(obj):
            return wrapped(*args, **kwargs)
        parent = otel_context.get_current()
        model, batch, expected = "unknown", None, 1
        request = argument(args, kwargs, 1, "request")
        if request is not None:
            with telemetry.log.guard("sglang server context"):
                parent = server_context(getattr(request, "headers", None), parent) or parent
        with telemetry.log.guard("sglang request"):
            model = model_name(instance)
            expected, is_batch = request_shape(obj)
            if is_batch and otel_context.get_value(_ENGINE_CALL, parent):
                batch = BatchScope(telemetry, model, expected)
                parent = batch.parent
            if getattr(obj, "external_trace_header", None) is None and _tracing_enabled(instance):
                carrier: dict[str, str] = {}
                propagate.inject(carrier, context=parent)
                obj.external_trace_header = carrier
        try:
            stream = wrapped(*args, **kwargs)
        except BaseException as exc:
            if batch is not None:
                batch.end(exc)
            raise
        observer = RequestGroup(telemetry, instance, obj, model, parent, batch, expected)
        observer.started = telemetry.requests_started(model, OPERATION, expected, parent)
        with telemetry.log.guard("sglang request"):
            activity = telemetry.engine_activity(model)
            if activity.probe_owner != id(instance):  # a new engine (or the first) of this model
                activity.probe, activity.probe_owner = output_stamp(instance), id(instance)
                scheduler_metrics.watch(instance, model)
        return observe(stream, observer)

    return wrapper


def engine_wrapper(
    wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    """``Engine.generate``: mark the call, so the request it makes knows a batch needs a parent."""
    if not should_observe():
        return wrapped(*args, **kwargs)
    token = otel_context.attach(otel_context.set_value(_ENGINE_CALL, True))
    try:
        return wrapped(*args, **kwargs)
    finally:
        otel_context.detach(token)


def async_engine_wrapper(
    wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    """``Engine.async_generate``: as :func:`engine_wrapper`, inside the awaiting task."""
    if not should_observe():
        return wrapped(*args, **kwargs)

    async def marked() -> Any:
        token = otel_context.attach(otel_context.set_value(_ENGINE_CALL, True))
        try:
            return await wrapped(*args, **kwargs)
        finally:
            otel_context.detach(token)

    return marked()
