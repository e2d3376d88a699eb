"""A framework's step or phase that can fail without failing the framework.

Shared by the framework hooks (verl's, TRL's, OpenRLHF's, slime's in
:mod:`otel_rollout.frameworks`): opening or closing our scope may fail (a bad attribute, an SDK
error); the framework's call must run on all the same, unobserved, and its own exception must
pass through untouched.
"""

from __future__ import annotations

from collections.abc import Callable
from types import FrameType, TracebackType
from typing import Any

from opentelemetry import trace

from otel_rollout.guard import LogOnce
from otel_rollout.phases import PhaseScope
from otel_rollout.ranks import SharedStep
from otel_rollout.steps import StepScope, rollout_step

__all__ = ["GuardedStep", "as_step", "framework_frame", "warn_once"]

_log = LogOnce()

FLUSH_TIMEOUT_MS = 1000
"""The most a step that flushes at its end (:class:`GuardedStep` ``flush``) waits for it."""


def warn_once(framework: str, what: str, exc: BaseException) -> None:
    """Our failure around a framework's call: said once per site; the framework runs on."""
    _log.failed(f"{framework} ({what}; {framework} runs on without a rollout step)", exc)


def framework_frame(frame: FrameType | None, skip_module: str | None = None) -> FrameType | None:
    """The first frame from ``frame`` outward that is the framework's: wrapt's own frames
    (present without its C extension) skipped, and those of module ``skip_module`` (a hook's
    wrapper around a re-export of what it wraps)."""
    while frame is not None:
        module = str(frame.f_globals.get("__name__", ""))
        if not (module.startswith("wrapt") or module == skip_module):
            break
        frame = frame.f_back
    return frame


def as_step(value: Any) -> int | None:
    """``value`` if a framework's step counter could hold it (an integer, not a bool)."""
    return value if isinstance(value, int) and not isinstance(value, bool) else None


class GuardedStep:
    """``rollout_step`` (or a phase) that can fail without failing the framework: our errors are
    logged once and the call goes on unobserved; the framework's exception passes through
    untouched."""

    def __init__(
        self,
        step: int,
        attributes: dict[str, Any],
        phase: Callable[[], PhaseScope] | None = None,
        framework: str = "verl",
        shared: SharedStep | None = None,
        flush: bool = False,
    ) -> None:
        self.step = step
        self.flush = flush
        """Hand the step's spans to the exporter as it ends (waiting at most
        :data:`FLUSH_TIMEOUT_MS`): for a step that ends in a Ray actor, which Ray may kill as
        soon as its caller has the result (``ray.shutdown()`` ends a job), with the batched spans
        still in it."""
        self.framework = framework
        self.shared = shared
        self.attributes = attributes
        self.phase = phase
        self.scope: StepScope | PhaseScope | None = None

    def __enter__(self) -> GuardedStep:
        try:
            scope: StepScope | PhaseScope = (
                self.phase()
                if self.phase is not None
                else rollout_step(
                    self.step,
                    shared=self.shared,
                    framework=self.framework.lower(),  # rollout.step.framework (rl.system)
                    **self.attributes,
                )
            )
            scope.__enter__()
        except Exception as exc:
            warn_once(self.framework, "opening the rollout step", exc)
        else:
            self.scope = scope
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        scope, self.scope = self.scope, None
        if scope is not None:
            try:
                scope.__exit__(exc_type, exc, tb)
                if self.flush:
                    flush = getattr(trace.get_tracer_provider(), "force_flush", None)
                    if flush is not None:
                        flush(FLUSH_TIMEOUT_MS)
            except Exception as err:
                warn_once(self.framework, "closing the rollout step", err)

    async def __aenter__(self) -> GuardedStep:
        return self.__enter__()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.__exit__(exc_type, exc, tb)
