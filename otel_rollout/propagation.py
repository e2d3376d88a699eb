"""W3C context in a plain ``dict``: what crosses a process boundary (Ray calls, HTTP headers).

Whatever ``OTEL_PROPAGATORS`` says, the W3C ``traceparent`` and ``baggage`` entries are always
written and read as well: the receiving side of otel_rollout relies on them, and ``rollout.step``
travels as baggage.
"""

from __future__ import annotations

from collections.abc import Mapping

from opentelemetry import baggage, propagate, trace
from opentelemetry import context as otel_context
from opentelemetry.baggage.propagation import W3CBaggagePropagator
from opentelemetry.context import Context
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from otel_rollout.context import step_number
from otel_rollout.semconv import ROLLOUT_STEP

_W3C = (TraceContextTextMapPropagator(), W3CBaggagePropagator())


def inject_context(
    carrier: dict[str, str] | None = None,
    *,
    step: int | None = None,
    context: Context | None = None,
) -> dict[str, str]:
    """The current trace context (and ``rollout.step`` baggage) as a picklable ``dict``.

    Call it on the driver inside ``rollout_step(i)`` and pass the result to the actor. The
    configured global propagators run first (so B3 or vendor headers a user chose are kept), then
    W3C ``traceparent`` and ``baggage`` are added if those propagators did not write them:
    :func:`continue_context` relies on them, whatever ``OTEL_PROPAGATORS`` says. ``step``
    overrides the step number; by default it is the open step's.
    """
    out: dict[str, str] = {} if carrier is None else carrier
    ctx = context if context is not None else otel_context.get_current()
    number = step if step is not None else step_number(ctx)
    if number is not None:
        ctx = baggage.set_baggage(ROLLOUT_STEP, str(number), ctx)
    propagate.inject(out, context=ctx)
    for propagator in _W3C:
        if not set(propagator.fields) & set(out):
            propagator.inject(out, context=ctx)
    return out


def extract_context(carrier: Mapping[str, str] | None) -> Context:
    """The driver's context from a carrier made by :func:`inject_context` (empty if ``None``)."""
    ctx = propagate.extract(carrier or {})
    if carrier:
        if not trace.get_current_span(ctx).get_span_context().is_valid:
            ctx = _W3C[0].extract(carrier, context=ctx)
        if not baggage.get_all(ctx):
            ctx = _W3C[1].extract(carrier, context=ctx)
    return ctx


def has_valid_span(ctx: Context | None = None) -> bool:
    return trace.get_current_span(ctx).get_span_context().is_valid


def server_context(
    headers: Mapping[str, str] | None, current: Context | None = None
) -> Context | None:
    """What a server attaches for a request with ``headers``, or ``None`` to keep ``current``.

    For the engine servers (vLLM's OpenAI server, SGLang's HTTP server), whose request spans
    would otherwise start traces of their own. ``headers`` may be Starlette's case-insensitive
    ``Headers``. A server span already made by ASGI/FastAPI instrumentation (a valid span in
    ``current``) is kept: the request span then becomes its child, in the caller's trace. Only
    what ``current`` lacks is taken from the headers — the caller's span when there is none,
    each baggage entry (``rollout.step``) that it does not hold — so nothing another
    instrumentation attached is overridden.
    """
    if headers is None:
        return None
    base = otel_context.get_current() if current is None else current
    extracted = extract_context(headers)
    ctx, changed = base, False
    if not has_valid_span(base) and has_valid_span(extracted):
        ctx = trace.set_span_in_context(trace.get_current_span(extracted), ctx)
        changed = True
    present = baggage.get_all(base)
    for key, value in baggage.get_all(extracted).items():
        # Entry by entry: baggage of another origin already in the context (a proxy's, another
        # middleware's) must not hide the caller's ``rollout.step``.
        if key not in present:
            ctx = baggage.set_baggage(key, value, ctx)
            changed = True
    return ctx if changed else None
