"""Where a request finds its training step: the OpenTelemetry context, and baggage across processes.

An open step lives in the context as a :class:`StepCollector` (in the process that opened it)
and as ``rollout.step`` baggage (everywhere the context was propagated to: Ray actors, engine
servers). The emitter asks this module which step a request belongs to; it never needs to know
how the step was opened.
"""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING, NamedTuple, Protocol, cast

from opentelemetry import baggage
from opentelemetry import context as otel_context

from otel_rollout.semconv import ROLLOUT_STEP

if TYPE_CHECKING:
    from opentelemetry.context import Context

    from otel_rollout.record import RequestRecord, TrajectoryRecord

_STEP_KEY = otel_context.create_key("otel_rollout.step")
_TRAJECTORY_KEY = otel_context.create_key("otel_rollout.trajectory")


class RecordCollector(Protocol):
    """Something that collects the finished requests of its context: a step, a trajectory."""

    def observe(self, record: RequestRecord) -> None: ...


class StepCollector(RecordCollector, Protocol):
    """What the emitter needs of an open step: its number, and a place for finished requests
    and for the trajectories that ended in it."""

    step: int | None

    def observe_trajectory(self, trajectory: TrajectoryRecord) -> None: ...

    def requests_started(self, count: int) -> None:
        """``count`` requests of this step entered an engine of this process (live progress)."""
        ...


def current_step(ctx: Context | None = None) -> StepCollector | None:
    """The step collecting this context's requests, if one is open in this process."""
    return cast("StepCollector | None", otel_context.get_value(_STEP_KEY, ctx))


def step_number(ctx: Context | None = None) -> int | None:
    """The step of this context: a local step scope, else ``rollout.step`` baggage (other processes)."""
    step = current_step(ctx)
    return step.step if step is not None else baggage_step(ctx)


def baggage_step(ctx: Context | None = None) -> int | None:
    """The step number ``rollout.step`` baggage carries: a step open in another process."""
    value = baggage.get_baggage(ROLLOUT_STEP, ctx)
    try:
        return int(str(value)) if value is not None else None
    except ValueError:
        return None


def with_step(collector: StepCollector, ctx: Context) -> Context:
    """``ctx`` with ``collector`` as its open step; the step number also goes into baggage."""
    ctx = otel_context.set_value(_STEP_KEY, collector, ctx)
    if collector.step is not None:
        # Baggage carries the step number to processes that only receive the propagated context.
        ctx = baggage.set_baggage(ROLLOUT_STEP, str(collector.step), ctx)
    return ctx


def current_trajectory(ctx: Context | None = None) -> RecordCollector | None:
    """The agentic trajectory (:mod:`otel_rollout.trajectories`) this context's requests are
    turns of, if one is open in this process."""
    return cast("RecordCollector | None", otel_context.get_value(_TRAJECTORY_KEY, ctx))


def with_trajectory(collector: RecordCollector | None, ctx: Context) -> Context:
    """``ctx`` with ``collector`` as its trajectory; ``None``: requests in it are no turns of one
    (a client that counts the turn itself, while an engine in this process serves it)."""
    return otel_context.set_value(_TRAJECTORY_KEY, collector, ctx)


def collectors(ctx: Context | None = None) -> tuple[RecordCollector, ...]:
    """Everything that collects this context's finished requests: its step, its trajectory."""
    return tuple(c for c in (current_step(ctx), current_trajectory(ctx)) if c is not None)


class StepView(NamedTuple):
    """What a hand-over needs to know of its context, looked up once (each lookup is a context
    read, and the baggage one a parse; the request path asked four times per request)."""

    step: StepCollector | None
    """The step open in this process, if any."""
    number: int | None
    """Its number, else the number ``rollout.step`` baggage carries (a step open elsewhere)."""
    collectors: tuple[RecordCollector, ...]
    """Everything that collects the context's finished requests: its step, its trajectory."""


_last_view: tuple[weakref.ref[Context], StepView] | None = None
"""The last context looked up and its view. A context is immutable (``set_value`` makes a new
one), so the same object has the same view; the requests of a step share their context, and a
stream asks at its start and its end. Held weakly: it never keeps a context (nor its step) alive."""


def step_view(ctx: Context | None = None) -> StepView:
    """:func:`current_step`, :func:`step_number` and :func:`collectors` of ``ctx`` at once."""
    global _last_view
    if ctx is None:
        ctx = otel_context.get_current()
    cached = _last_view
    if cached is not None and cached[0]() is ctx:
        return cached[1]
    view = _look_up(ctx)
    _last_view = (weakref.ref(ctx, _forget_view), view)
    return view


def _forget_view(ref: weakref.ref[Context]) -> None:
    """The cached context is gone: its view (its step) goes with it."""
    global _last_view
    cached = _last_view
    if cached is not None and cached[0] is ref:
        _last_view = None


def _look_up(ctx: Context) -> StepView:
    step = current_step(ctx)
    trajectory = current_trajectory(ctx)
    if step is not None:
        number = step.step
        found: tuple[RecordCollector, ...] = (step,) if trajectory is None else (step, trajectory)
    else:
        number = baggage_step(ctx)
        found = () if trajectory is None else (trajectory,)
    return StepView(step, number, found)
