"""W3C context in a plain ``dict``: what crosses a process boundary (Ray calls, HTTP headers).

Whatever ``OTEL_PROPAGATORS`` says, the W3C ``traceparent`` and ``baggage`` entries are always
written and read as well: the receiving side of otel_rollout relies on them, and ``rollout.step``
travels as baggage.

Over HTTP the step number also rides in an entry of our own in W3C ``tracestate``
(``rollout_step=3``, :func:`add_step_tracestate`): proxies in front of engine servers may forward
the trace context but not baggage — sglang-router 0.3 passes ``traceparent``, ``tracestate`` and
``x-request-id`` and drops every other header — and a server that gets no ``rollout.step``
baggage takes the number from there (:func:`extract_context`).
"""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping

from opentelemetry import baggage, propagate, trace
from opentelemetry import context as otel_context
from opentelemetry.baggage.propagation import W3CBaggagePropagator
from opentelemetry.context import Context
from opentelemetry.trace import TraceState
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from otel_rollout.context import step_number
from otel_rollout.semconv import ROLLOUT_STEP

_W3C = (TraceContextTextMapPropagator(), W3CBaggagePropagator())
TRACESTATE = "tracestate"
STEP_TRACESTATE_KEY = "rollout_step"
"""Our ``tracestate`` entry: the step number, for hops that drop baggage."""


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
    """The driver's context from a carrier made by :func:`inject_context` (empty if ``None``);
    with no ``rollout.step`` baggage, the step number of our ``tracestate`` entry, if any."""
    ctx = propagate.extract(carrier or {})
    if carrier:
        if not trace.get_current_span(ctx).get_span_context().is_valid:
            ctx = _W3C[0].extract(carrier, context=ctx)
        if not baggage.get_all(ctx):
            ctx = _W3C[1].extract(carrier, context=ctx)
        if baggage.get_baggage(ROLLOUT_STEP, ctx) is None:
            number = tracestate_step(carrier.get(TRACESTATE))
            if number is not None:
                ctx = baggage.set_baggage(ROLLOUT_STEP, str(number), ctx)
    return ctx


def add_step_tracestate(headers: MutableMapping[str, str], step: int) -> None:
    """Put ``step`` into ``headers``' ``tracestate`` as our entry, first (W3C: an updated entry
    moves to the left), the other vendors' entries kept; a header that does not parse is left
    as it is (it is not ours to repair)."""
    given = headers.get(TRACESTATE)
    state = TraceState.from_header([given]) if given else TraceState()
    if given and not state:
        return  # unparseable (from_header gave an empty state): leave the caller's header alone
    if STEP_TRACESTATE_KEY in state:
        state = state.delete(STEP_TRACESTATE_KEY)
    entries = [(STEP_TRACESTATE_KEY, str(step)), *list(state.items())[: 32 - 1]]
    headers[TRACESTATE] = TraceState(entries).to_header()


def tracestate_step(header: str | None) -> int | None:
    """The step number of our entry in a ``tracestate`` header value, if it has a valid one."""
    if not header or STEP_TRACESTATE_KEY not in header:
        return None
    value = TraceState.from_header([header]).get(STEP_TRACESTATE_KEY)
    return int(value) if value is not None and value.isdigit() else None


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
