"""Step phases: the parts of a training step the engines do not see (reward, log-probs, update, …).

One model of a phase for every source: the public ``rollout_phase(name)`` (any training loop) and
the framework hooks that translate a framework's own timers into it (verl's ``marked_timer``,
:mod:`otel_rollout.frameworks.verl`). A phase is

* a child span of whatever is current (the step, or an enclosing phase): ``rollout.phase``,
  with ``rollout.phase.name`` and, from a framework, the framework's own timer name;
* a point of ``rollout.step.phase.duration`` labelled with the phase name (bounded: after
  :data:`MAX_PHASE_NAMES` distinct names, further ones are recorded as ``other``);
* for a phase directly under a step, its seconds added to that step's totals: the step span
  then carries each phase's total and the time no phase covered (``rollout.step.unaccounted_s``).

A phase never changes what it wraps: the wrapped code's exceptions pass through (the span records
them), and a failure of ours is logged once.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

from opentelemetry import context as otel_context
from opentelemetry import trace

from otel_rollout.context import current_step
from otel_rollout.decorating import each_call_in
from otel_rollout.semconv import (
    PHASE_FRAMEWORK,
    PHASE_FRAMEWORK_NAME,
)
from otel_rollout.telemetry import StepTelemetry, job_step_telemetry

__all__ = ["MAX_PHASE_NAMES", "PhaseScope", "phase_label", "rollout_phase"]

F = TypeVar("F", bound=Callable[..., Any])
_PHASE_KEY = otel_context.create_key("otel_rollout.phase")

MAX_PHASE_NAMES = 64
"""Distinct phase names a process labels metrics with; a loop that builds names from data
(``f"reward_{i}"``) would otherwise grow the metric's series without bound."""
_names: set[str] = set()
_names_lock = threading.Lock()


def phase_label(name: str, telemetry: StepTelemetry) -> str:
    """The metric label for ``name``: itself while the set of names stays bounded, else ``other``."""
    with _names_lock:
        if name in _names or len(_names) < MAX_PHASE_NAMES:
            _names.add(name)
            return name
    telemetry.log.warn(
        "phase names",
        "otel_rollout: more than %d distinct phase names; %r and later new names are recorded "
        "as phase 'other' on rollout.step.phase.duration (their spans keep the real name)",
        MAX_PHASE_NAMES,
        name,
    )
    return "other"


class PhaseScope:
    """``with rollout_phase("reward"):`` / ``async with`` / ``@rollout_phase("reward")``."""

    def __init__(
        self,
        name: str,
        *,
        framework: str | None = None,
        framework_name: str | None = None,
        telemetry: StepTelemetry | None = None,
        tracer: trace.Tracer | None = None,
        **attributes: Any,
    ) -> None:
        self.name = name
        self._tracer = tracer
        """Whose span it is: the steps' tracer unless an instrumentation of its own source
        (an engine's, :mod:`otel_rollout.engine_ops`) makes it."""
        self.attributes: dict[str, Any] = dict(attributes)
        if framework is not None:
            self.attributes[PHASE_FRAMEWORK] = framework
        if framework_name is not None:
            self.attributes[PHASE_FRAMEWORK_NAME] = framework_name
        self._given = telemetry
        self._telemetry: StepTelemetry | None = None
        self._span: trace.Span | None = None
        self._token: object | None = None
        self._step: Any = None
        self._top_level = False
        self._started = 0.0
        self._start_ns = 0
        self.seconds: float | None = None
        """The phase's wall time once it ended (monotonic clock)."""

    def __enter__(self) -> PhaseScope:
        telemetry = self._telemetry = self._given or job_step_telemetry()
        ctx = otel_context.get_current()
        self._step = current_step(ctx)
        self._top_level = otel_context.get_value(_PHASE_KEY, ctx) is None
        # One instant for the span's start and the phase's seconds: the span is as long as the
        # figure on the step (and as the framework's own timer), whatever runs in between.
        self._started, start_ns = time.monotonic(), time.time_ns()
        self._start_ns = start_ns
        with telemetry.log.guard("phase span"):
            self._span = telemetry.start_phase(
                self.name, self.attributes, start_ns, tracer=self._tracer
            )
            ctx = trace.set_span_in_context(self._span, ctx)
        self._token = otel_context.attach(otel_context.set_value(_PHASE_KEY, self, ctx))
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: object
    ) -> None:
        self.seconds, end_ns = time.monotonic() - self._started, time.time_ns()
        if self._token is not None:
            otel_context.detach(self._token)  # type: ignore[arg-type]
            self._token = None
        telemetry = self._telemetry or job_step_telemetry()
        if self._span is not None:
            label = phase_label(self.name, telemetry)
            telemetry.finish_phase(self._span, label, self.seconds, exc, end_ns)
            self._span = None
        add = getattr(self._step, "add_phase", None)
        if self._top_level and add is not None:
            with telemetry.log.guard("phase totals"):
                add(self.name, self.seconds, self._start_ns, end_ns)

    async def __aenter__(self) -> PhaseScope:
        return self.__enter__()

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: object
    ) -> None:
        self.__exit__(exc_type, exc, tb)

    def __call__(self, func: F) -> F:
        """As a decorator every call is one phase of that name."""
        template = self

        def scope() -> PhaseScope:
            return PhaseScope(
                template.name,
                telemetry=template._given,
                tracer=template._tracer,
                **template.attributes,
            )

        return each_call_in(func, scope)


def rollout_phase(name: str, **attributes: Any) -> PhaseScope:
    """Open phase ``name`` of the current step: a context manager (sync or async) and a decorator."""
    return PhaseScope(name, **attributes)
