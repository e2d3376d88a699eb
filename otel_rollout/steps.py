"""Training steps: the step span every request of a step nests under, and its tail analytics.

The engines already export serving metrics; what they cannot know is which *training step* a
request belonged to. ``rollout_step(i)`` puts a step into the OpenTelemetry context, so every
request issued inside it — offline batch, async tasks, Ray actors that received the context — is a
descendant of the step span, and when the step ends its requests are summarised: how long the step
waited on its tail, how many stragglers, how much in-flight capacity sat idle meanwhile.
"""

from __future__ import annotations

import functools
import inspect
import itertools
import logging
import math
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from opentelemetry import baggage, metrics, trace
from opentelemetry import context as otel_context
from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode

from otel_rollout import semconv as R
from otel_rollout.config import DEFAULT_RATIO_BUCKETS, RolloutConfig, load_config
from otel_rollout.record import FINISH_LENGTH, RequestRecord

if TYPE_CHECKING:
    from opentelemetry.context import Context

_logger = logging.getLogger(__name__)

STEP_SPAN_NAME = "rollout.step"
_STEP_KEY = otel_context.create_key("otel_rollout.step")
F = TypeVar("F", bound=Callable[..., Any])

_FRACTION_BUCKETS = (0.01, 0.02, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)
_COUNT_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 65536)


def current_step(ctx: Context | None = None) -> StepScope | None:
    """The step collecting this context's requests, if one is open in this process."""
    return otel_context.get_value(_STEP_KEY, ctx)  # type: ignore[return-value]


def step_number(ctx: Context | None = None) -> int | None:
    """The step of this context: a local step scope, else ``rollout.step`` baggage (Ray actors)."""
    step = current_step(ctx)
    if step is not None:
        return step.step
    value = baggage.get_baggage(R.ROLLOUT_STEP, ctx)
    try:
        return int(value) if value is not None else None
    except (TypeError, ValueError):
        return None


def _rank(sorted_values: Sequence[float], q: float) -> float:
    """Nearest-rank quantile: a value that really occurred, so it can be traced to a request."""
    index = max(0, math.ceil(q * len(sorted_values)) - 1)
    return sorted_values[index]


@dataclass(frozen=True)
class Straggler:
    duration_s: float
    output_tokens: int | None
    finish_reason: str | None
    trace_id: str
    span_id: str


@dataclass(frozen=True)
class StepStats:
    """What a step's requests say about its tail; every value is derived from their timelines."""

    requests: int
    duration_s: float
    window_s: float
    tail_quantile: float
    tail_start_ns: int
    tail_duration_s: float
    tail_requests: int
    latency_p50_s: float
    latency_p90_s: float
    latency_max_s: float
    straggler_ratio: float
    output_tokens_p50: int
    output_tokens_p90: int
    output_tokens_max: int
    truncation_ratio: float
    peak_active: int
    idle_capacity_s: float
    idle_fraction: float
    stragglers: tuple[Straggler, ...] = field(default=())

    @property
    def tail_fraction(self) -> float:
        return self.tail_duration_s / self.duration_s if self.duration_s > 0 else 0.0


def analyze(
    observed: Sequence[tuple[RequestRecord, SpanContext | None]],
    duration_s: float,
    tail_quantile: float = 0.9,
    stragglers: int = 5,
) -> StepStats | None:
    """Compute a step's tail analytics from its requests; ``None`` for a step without requests.

    The tail starts at the finish of the request that brought the finished share to
    ``tail_quantile``; the requests finishing after it are the stragglers the step waited on.
    Idle capacity integrates (peak in-flight − in-flight) over the rollout window, first arrival
    to last finish: the request-slots the engine had proven it could hold but that sat empty.
    """
    if not observed:
        return None
    records = [r for r, _ in observed]
    n = len(records)
    finishes = sorted(r.finish_ns for r in records)
    tail_start = finishes[max(0, math.ceil(tail_quantile * n) - 1)]
    last = finishes[-1]
    latencies = sorted(r.duration_s for r in records)
    tokens = sorted(r.output_tokens or 0 for r in records)
    median = _rank(latencies, 0.5)

    # Sweep the arrival/finish events once: in-flight count as a step function of time.
    events = sorted([(r.arrival_ns, 1) for r in records] + [(r.finish_ns, -1) for r in records],
                    key=lambda e: (e[0], e[1]))
    first = events[0][0]
    active = peak = 0
    segments: list[tuple[int, int]] = []  # (length ns, in-flight during it)
    prev = first
    for ts, delta in events:
        if ts > prev:
            segments.append((ts - prev, active))
            prev = ts
        active += delta
        peak = max(peak, active)
    window_ns = last - first
    idle_ns = sum(length * (peak - level) for length, level in segments)
    idle_fraction = idle_ns / (peak * window_ns) if peak and window_ns > 0 else 0.0

    slowest = sorted(observed, key=lambda o: o[0].duration_s, reverse=True)[:stragglers]
    return StepStats(
        requests=n,
        duration_s=duration_s,
        window_s=window_ns / 1e9,
        tail_quantile=tail_quantile,
        tail_start_ns=tail_start,
        tail_duration_s=(last - tail_start) / 1e9,
        tail_requests=sum(1 for f in finishes if f > tail_start),
        latency_p50_s=median,
        latency_p90_s=_rank(latencies, 0.9),
        latency_max_s=latencies[-1],
        straggler_ratio=latencies[-1] / median if median > 0 else 1.0,
        output_tokens_p50=int(_rank(tokens, 0.5)),
        output_tokens_p90=int(_rank(tokens, 0.9)),
        output_tokens_max=int(tokens[-1]),
        truncation_ratio=sum(1 for r in records if r.finish_reason == FINISH_LENGTH) / n,
        peak_active=peak,
        idle_capacity_s=idle_ns / 1e9,
        idle_fraction=idle_fraction,
        stragglers=tuple(
            Straggler(r.duration_s, r.output_tokens, r.finish_reason,
                      format(sc.trace_id, "032x") if sc else "", format(sc.span_id, "016x") if sc else "")
            for r, sc in slowest),
    )


class StepScope:
    """``with rollout_step(i):`` / ``async with`` / ``@rollout_step(i)``: one training step.

    Requests observed inside the scope (in any thread or task that inherited its context) are
    collected; on exit the analytics go onto the step span and into ``rollout.step.*`` metrics.
    """

    def __init__(self, step: int | None = None, *, config: RolloutConfig | None = None,
                 **attributes: Any) -> None:
        self.step = step
        self.attributes = attributes
        self._config = config
        self._observed: list[tuple[RequestRecord, SpanContext | None]] = []
        self._lock = threading.Lock()
        self._token: object | None = None
        self._span: trace.Span | None = None
        self._started = 0.0
        self._numbering: itertools.count[int] | None = None
        self.stats: StepStats | None = None

    # --- collection -------------------------------------------------------------------------

    def observe(self, record: RequestRecord, span_context: SpanContext | None) -> None:
        with self._lock:
            self._observed.append((record, span_context))

    # --- context manager ----------------------------------------------------------------------

    def __enter__(self) -> StepScope:
        if self._config is None:
            self._config = load_config(warn=False)
        attrs = {f"rollout.step.{k}" if not k.startswith("rollout.") else k: v
                 for k, v in self.attributes.items()}
        if self.step is not None:
            attrs[R.ROLLOUT_STEP] = self.step
        self._span = trace.get_tracer("otel_rollout").start_span(
            STEP_SPAN_NAME, kind=SpanKind.INTERNAL, attributes=attrs)
        ctx = trace.set_span_in_context(self._span)
        ctx = otel_context.set_value(_STEP_KEY, self, ctx)
        if self.step is not None:
            # Baggage carries the step number to processes that only receive the propagated context.
            ctx = baggage.set_baggage(R.ROLLOUT_STEP, str(self.step), ctx)
        self._token = otel_context.attach(ctx)
        self._started = time.monotonic()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: object) -> None:
        duration = time.monotonic() - self._started
        span = self._span
        assert span is not None and self._token is not None
        otel_context.detach(self._token)  # type: ignore[arg-type]
        self._token = None
        try:
            if exc is not None:
                span.set_status(Status(StatusCode.ERROR, type(exc).__qualname__))
                span.set_attribute("error.type", type(exc).__qualname__)
            self._finish(span, duration)
        except Exception:
            _logger.warning("otel_rollout: step analytics failed; training continues", exc_info=True)
        finally:
            span.end()

    async def __aenter__(self) -> StepScope:
        return self.__enter__()

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: object) -> None:
        self.__exit__(exc_type, exc, tb)

    def __call__(self, func: F) -> F:
        """As a decorator each call is a step: the given number, or 1, 2, 3… when none was given."""
        template = self

        def scope() -> StepScope:
            step = template.step
            if step is None:
                if template._numbering is None:
                    template._numbering = itertools.count(1)
                step = next(template._numbering)
            return StepScope(step, config=template._config, **template.attributes)

        if inspect.iscoroutinefunction(func):
            @functools.wraps(func)
            async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
                async with scope():
                    return await func(*args, **kwargs)
            return async_wrapper  # type: ignore[return-value]

        @functools.wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            with scope():
                return func(*args, **kwargs)
        return wrapper  # type: ignore[return-value]

    # --- analytics ------------------------------------------------------------------------------

    def _finish(self, span: trace.Span, duration: float) -> None:
        config = self._config or RolloutConfig()
        with self._lock:
            observed = list(self._observed)
            self._observed.clear()
        stats = analyze(observed, duration, config.tail_quantile, config.summary_stragglers)
        self.stats = stats
        span.set_attribute(R.STEP_REQUESTS, len(observed))
        if stats is None:
            return
        span.set_attributes({
            R.STEP_TAIL_DURATION: stats.tail_duration_s,
            R.STEP_TAIL_REQUESTS: stats.tail_requests,
            R.STEP_TAIL_FRACTION: stats.tail_fraction,
            R.STEP_STRAGGLER_RATIO: stats.straggler_ratio,
            R.STEP_LATENCY_P50: stats.latency_p50_s,
            R.STEP_LATENCY_P90: stats.latency_p90_s,
            R.STEP_LATENCY_MAX: stats.latency_max_s,
            R.STEP_OUTPUT_TOKENS_P50: stats.output_tokens_p50,
            R.STEP_OUTPUT_TOKENS_P90: stats.output_tokens_p90,
            R.STEP_OUTPUT_TOKENS_MAX: stats.output_tokens_max,
            R.STEP_TRUNCATION_RATIO: stats.truncation_ratio,
            R.STEP_IDLE_CAPACITY: stats.idle_capacity_s,
            R.STEP_IDLE_FRACTION: stats.idle_fraction,
            R.STEP_PEAK_ACTIVE: stats.peak_active,
        })
        self._record_metrics(stats, config, trace.set_span_in_context(span), observed)
        if config.step_summary:
            print(format_summary(self.step, stats), file=sys.stderr, flush=True)
        if config.step_log or config.report_dir:
            from otel_rollout import report  # matplotlib is optional; only load it when asked

            entry = report.step_entry(self.step, stats, observed)
            if config.step_log:
                report.append_step_log(config.step_log, entry)
            if config.report_dir:
                try:
                    report.write_png(entry, config.report_dir)
                except ImportError as exc:
                    _warn_once(str(exc))

    def _record_metrics(self, stats: StepStats, config: RolloutConfig, ctx: Context,
                        observed: Sequence[tuple[RequestRecord, SpanContext | None]]) -> None:
        meter = metrics.get_meter("otel_rollout")
        first = observed[0][0]
        attrs = {"gen_ai.provider.name": first.provider, "gen_ai.request.model": first.model}

        def hist(name: str, unit: str, buckets: Sequence[float], desc: str) -> metrics.Histogram:
            return meter.create_histogram(name, unit=unit, description=desc,
                                          explicit_bucket_boundaries_advisory=buckets)

        lat = config.latency_buckets
        points: tuple[tuple[str, str, Sequence[float], str, float], ...] = (
            (R.METRIC_STEP_DURATION, "s", lat, "Wall time of a training step's scope.",
             stats.duration_s),
            (R.METRIC_STEP_TAIL_DURATION, "s", lat,
             "Time from the tail quantile of finishes to the last finish.", stats.tail_duration_s),
            (R.METRIC_STEP_TAIL_REQUESTS, "{request}", _COUNT_BUCKETS,
             "Requests still running when the tail began.", stats.tail_requests),
            (R.METRIC_STEP_REQUESTS, "{request}", _COUNT_BUCKETS, "Requests in the step.",
             stats.requests),
            (R.METRIC_STEP_STRAGGLER_RATIO, "1", DEFAULT_RATIO_BUCKETS,
             "Slowest request latency over the median.", stats.straggler_ratio),
            (R.METRIC_STEP_TRUNCATION_RATIO, "1", _FRACTION_BUCKETS,
             "Share of requests that stopped at max_tokens.", stats.truncation_ratio),
            (R.METRIC_STEP_IDLE_CAPACITY, "s", lat,
             "Request-seconds of in-flight capacity left unused during the rollout window.",
             stats.idle_capacity_s),
            (R.METRIC_STEP_IDLE_FRACTION, "1", _FRACTION_BUCKETS,
             "Idle capacity as a share of peak in-flight × window.", stats.idle_fraction),
        )
        for name, unit, buckets, desc, value in points:
            hist(name, unit, buckets, desc).record(value, attrs, context=ctx)
        tokens = hist(R.METRIC_STEP_OUTPUT_TOKENS, "{token}", config.token_buckets,
                      "Per-step response length statistics.")
        for stat, value in (("max", stats.output_tokens_max), ("p50", stats.output_tokens_p50),
                            ("p90", stats.output_tokens_p90)):
            tokens.record(value, {**attrs, R.ROLLOUT_STATISTIC: stat}, context=ctx)


@functools.lru_cache(maxsize=8)
def _warn_once(message: str) -> None:
    """A missing optional dependency is said once per process, not once per step."""
    _logger.warning("otel_rollout: %s; step PNGs are skipped", message)


def rollout_step(step: int | None = None, **attributes: Any) -> StepScope:
    """Open training step ``step``: a context manager (sync or async) and a decorator."""
    return StepScope(step, **attributes)


def format_summary(step: int | None, stats: StepStats) -> str:
    """The terminal view for users without a metrics stack: one headline, then the stragglers."""
    label = f"step {step}" if step is not None else "step"
    lines = [
        f"[otel_rollout] {label}: {stats.requests} requests in {stats.duration_s:.2f} s | "
        f"latency p50 {stats.latency_p50_s:.2f} s p90 {stats.latency_p90_s:.2f} s "
        f"max {stats.latency_max_s:.2f} s | length p50 {stats.output_tokens_p50} "
        f"p90 {stats.output_tokens_p90} max {stats.output_tokens_max} tokens",
        f"  tail: {stats.tail_duration_s:.2f} s ({stats.tail_fraction:.0%} of the step) after "
        f"{stats.tail_quantile:.0%} had finished, {stats.tail_requests} still running | "
        f"straggler ratio {stats.straggler_ratio:.1f}x | truncated {stats.truncation_ratio:.0%} | "
        f"idle capacity {stats.idle_capacity_s:.2f} request-s ({stats.idle_fraction:.0%})",
    ]
    for s in stats.stragglers:
        tokens = "?" if s.output_tokens is None else s.output_tokens
        lines.append(f"  slow: {s.duration_s:8.3f} s {tokens:>6} tokens "
                     f"{s.finish_reason or '-':<6} trace_id={s.trace_id} span_id={s.span_id}")
    return "\n".join(lines)
