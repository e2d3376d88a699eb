"""Training steps: ``rollout_step(i)``, the scope every request of a step nests under.

The engines already export serving metrics; what they cannot know is which *training step* a
request belonged to. ``rollout_step(i)`` puts a step into the OpenTelemetry context (see
:mod:`otel_rollout.context`), so every request issued inside it — offline batch, async tasks,
Ray actors that received the context — is a descendant of the step span. The scope itself only
holds that context and the records of the step's requests; when it ends it hands them to the
pure analysis (:mod:`otel_rollout.analysis`), the emitter (:mod:`otel_rollout.telemetry`) and the
reports (:mod:`otel_rollout.reports`), in that order.

A step's end never waits for the background emitter (:mod:`otel_rollout.emitter`): records reach
the step when the wrapper hands them over, already carrying the trace and span ids their spans
will have, so the analysis, the summary's straggler ids and the step log are complete at once
while the request spans and metric points are still being made. Where telemetry must be out of
the process now (before a Ray actor is killed, at the end of a script that reads its own
exporter), call ``otel_rollout.sdk.force_flush()``; a normal exit drains the emitter by itself.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from opentelemetry import context as otel_context
from opentelemetry import trace

from otel_rollout import engine_stats, reports
from otel_rollout.analysis import StepStats, analyze
from otel_rollout.config import RolloutConfig, load_config
from otel_rollout.context import current_step, step_number, with_step
from otel_rollout.decorating import each_call_in
from otel_rollout.sampling import StepSampling
from otel_rollout.telemetry import (
    StepTelemetry,
    Telemetry,
    engine_activities,
    job_step_telemetry,
)

if TYPE_CHECKING:
    from opentelemetry.context import Context

    from otel_rollout.ranks import SharedStep
    from otel_rollout.record import RequestRecord, TrajectoryRecord

__all__ = [
    "StepScope",
    "StepStats",
    "batch_in_step",
    "batch_step",
    "current_step",
    "rollout_step",
    "set_step",
]

_logger = logging.getLogger(__name__)
F = TypeVar("F", bound=Callable[..., Any])


class RemoteRequests(Protocol):
    """What a step channel brings back at a step's end from the processes the step reached."""

    records: list[RequestRecord]
    missing_calls: int
    """Remote calls made under the step that never reported (their worker died, or is late)."""
    trajectories: list[TrajectoryRecord]
    """Trajectories that ended in those processes (an agent-loop worker's)."""


class StepChannel(Protocol):
    """A way for records of other processes to reach the process that opened the step.

    Registered by an integration that knows the distributed machinery the job runs on (Ray);
    the step scope itself stays ignorant of it.
    """

    def open(self, scope: StepScope, ctx: Context) -> Context:
        """Called as the step opens; returns ``ctx`` with whatever other processes need."""
        ...

    def close(self, scope: StepScope, wait_s: float) -> RemoteRequests | None:
        """Called as the step ends: the other processes' records, waiting at most ``wait_s``."""
        ...


_CHANNELS: list[StepChannel] = []


def register_channel(channel: StepChannel) -> None:
    if channel not in _CHANNELS:
        _CHANNELS.append(channel)


def unregister_channel(channel: StepChannel) -> None:
    if channel in _CHANNELS:
        _CHANNELS.remove(channel)


class StepScope:
    """``with rollout_step(i):`` / ``async with`` / ``@rollout_step(i)``: one training step.

    Requests observed inside the scope (in any thread or task that inherited its context) are
    collected; on exit the analytics go onto the step span and into ``rollout.step.*`` metrics.
    ``stats`` holds them afterwards, for the trainer's own logger.
    """

    def __init__(
        self,
        step: int | None = None,
        *,
        config: RolloutConfig | None = None,
        telemetry: Telemetry | StepTelemetry | None = None,
        shared: SharedStep | None = None,
        **attributes: Any,
    ) -> None:
        self.step = step
        self.attributes = attributes
        self.shared = shared
        """Every rank of the job opens this step (:mod:`otel_rollout.ranks`): its span goes into
        the trace they share, as its root (rank 0) or a child of rank 0's."""
        self._config = config
        self._given = telemetry
        self._telemetry: StepTelemetry | None = (
            telemetry.steps if isinstance(telemetry, Telemetry) else telemetry
        )
        self._records: list[RequestRecord] = []
        self._trajectories: list[TrajectoryRecord] = []
        self._lock = threading.Lock()
        self._token: object | None = None
        self._span: trace.Span | None = None
        self._started = 0.0
        self._numbering: itertools.count[int] | None = None
        self._channels: list[StepChannel] = []
        self.stats: StepStats | None = None
        self.partial = False
        """True when some process the step reached did not report its requests in time."""
        self.phases: dict[str, float] = {}
        """Seconds per top-level phase of the step (:mod:`otel_rollout.phases`), summed by name."""
        self._start_ns = 0
        self.phase_intervals: list[tuple[str, int, int]] = []
        """Each top-level phase as ``(name, start_ns, end_ns)``: the step timeline of the
        reports (summary, step log, PNG lane)."""
        self.sampling = StepSampling(holds=True)
        """Its running count of requests started and done in this process, and so which of its
        request spans are kept (:mod:`otel_rollout.sampling`)."""

    # --- collection -------------------------------------------------------------------------

    def observe(self, record: RequestRecord) -> None:
        with self._lock:
            self._records.append(record)

    @property
    def started(self) -> int:
        """Requests of this step that entered an engine of this process so far."""
        return self.sampling.started

    def requests_started(self, count: int) -> None:
        self.sampling.requests_started(count)

    def progress(self) -> tuple[int, int]:
        """Requests of this step done and started so far in this process (live progress)."""
        with self._lock:
            done = len(self._records)
        return done, max(self.started, done)

    def observe_trajectory(self, trajectory: TrajectoryRecord) -> None:
        """An agentic trajectory opened inside this step ended (:mod:`otel_rollout.trajectories`)."""
        with self._lock:
            self._trajectories.append(trajectory)

    def add_phase(
        self, name: str, seconds: float, start_ns: int | None = None, end_ns: int | None = None
    ) -> None:
        """A phase directly under this step ended (:class:`otel_rollout.phases.PhaseScope`)."""
        with self._lock:
            self.phases[name] = self.phases.get(name, 0.0) + seconds
            if start_ns is not None and end_ns is not None:
                self.phase_intervals.append((name, start_ns, end_ns))

    def add_held(self, state: str, start_ns: int, end_ns: int) -> None:
        """The engine stayed ``state`` (paused, asleep) over the interval: held, for the causes."""
        with self._lock:
            self.phase_intervals.append((f"engine_{state}", start_ns, end_ns))

    # --- context manager ----------------------------------------------------------------------

    def __enter__(self) -> StepScope:
        if self._config is None:
            self._config = load_config(warn=False)
        telemetry = self._telemetry or job_step_telemetry()
        self._telemetry = telemetry
        with telemetry.log.guard("step progress"):
            telemetry.observe_progress(open_step_progress)
        ctx: Context = with_step(self, otel_context.get_current())
        for channel in list(_CHANNELS):
            with telemetry.log.guard("step channel"):
                ctx = channel.open(self, ctx)
                self._channels.append(channel)
        # One instant for the span's start and the step's duration, taken after our own set-up
        # (the first step builds the telemetry, the Ray channel finds its collector): the span
        # is the caller's scope, as long as a framework's own step timer, not our cost.
        self._started, start_ns = time.monotonic(), time.time_ns()
        self._start_ns = start_ns
        with telemetry.log.guard("step span"):
            self._span = telemetry.start_step(self.step, self.attributes, start_ns, self.shared)
            ctx = trace.set_span_in_context(self._span, ctx)
        self._token = otel_context.attach(ctx)
        _OPEN.add(self)
        engine_stats.open_window(id(self))
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: object
    ) -> None:
        # the span ends here, not after the remote reports came in
        duration, ended_ns = time.monotonic() - self._started, time.time_ns()
        _OPEN.discard(self)
        telemetry = self._telemetry or job_step_telemetry()
        with telemetry.log.guard("step sampling"):
            # what waits in it (its tail, its slowest) is decided before the analysis names spans
            self.sampling.release(final=True)
        windows = list(engine_stats.close(id(self)).values())
        if self._token is not None:
            otel_context.detach(self._token)  # type: ignore[arg-type]
            self._token = None
        config = self._config or RolloutConfig()
        missing = 0
        for channel in self._channels:
            closed = False
            with telemetry.log.guard("step channel"):
                remote = channel.close(self, config.step_wait)
                if remote is not None:
                    self._records.extend(remote.records)
                    self._trajectories.extend(remote.trajectories)
                    missing += remote.missing_calls
                closed = True
            if not closed:  # what the channel held is unknown: the step is partial, not complete
                missing += 1
        self._channels = []
        self.partial = missing > 0
        with self._lock:
            records, trajectories = list(self._records), list(self._trajectories)
            self._records.clear()
            self._trajectories.clear()
        stats: StepStats | None = None
        with telemetry.log.guard("step analytics"):
            stats = analyze(
                records,
                duration,
                config.tail_quantile,
                config.summary_stragglers,
                trajectories,
                weight_version=self.attributes.get("weight_version"),
                newest_versions=_versions_at_last_finish(records),
                engine_windows=windows,
                step_ns=(self._start_ns, ended_ns),
                phases=list(self.phase_intervals),
            )
        self.stats = stats
        if self._span is not None:
            telemetry.finish_step(
                self._span,
                len(records),
                stats,
                exc,
                records[0] if records else None,
                missing_calls=missing,
                phases=dict(self.phases),
                duration_s=duration,
                end_ns=ended_ns,
            )
            self._span = None
        if stats is not None:
            with telemetry.log.guard("step reports"):
                reports.publish(
                    self.step, stats, records, config, trajectories, list(self.phase_intervals)
                )

    async def __aenter__(self) -> StepScope:
        return self.__enter__()

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: object
    ) -> None:
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
            return StepScope(
                step, config=template._config, telemetry=template._given, **template.attributes
            )

        return each_call_in(func, scope)


def _versions_at_last_finish(records: list[RequestRecord]) -> list[object]:
    """The weight versions this process's engines ran when the step's last request finished: not
    at the step's end, where a synchronous loop has synced the next step's weights (on-policy
    samples, staleness 0)."""
    if not records:
        return []
    last = max(r.finish_ns for r in records)
    return [a.weights.at(last) for _, _, a in engine_activities() if a.weights.seen]


_OPEN: weakref.WeakSet[StepScope] = weakref.WeakSet()


def open_steps() -> list[StepScope]:
    """The steps open in this process now, oldest first (the stall watch reports their progress)."""
    return sorted(list(_OPEN), key=lambda s: s._started)


def open_step_progress() -> list[tuple[int | None, int, int]]:
    """(step, done, started) of each step open in this process: the stall watch's line."""
    return [(scope.step, *scope.progress()) for scope in open_steps()]


def rollout_step(
    step: int | None = None, *, shared: SharedStep | None = None, **attributes: Any
) -> StepScope:
    """Open training step ``step``: a context manager (sync or async) and a decorator. Extra
    keywords become ``rollout.step.<key>`` attributes; ``shared``: every rank of the job opens
    this step (:func:`otel_rollout.ranks.shared_step`), all in one trace."""
    return StepScope(step, shared=shared, **attributes)


class _AutoSteps:
    """The numbers ``OTEL_ROLLOUT_BATCH_AS_STEP`` gives its steps: 1, 2, 3… unless the trainer says.

    A trainer that cannot wrap its rollout in ``rollout_step`` (verl's loop, say) can still make
    the numbers match its own: by propagating ``rollout.step`` baggage into the call's context, or
    by :func:`set_step` before the call — after a resume too, where counting from 1 would repeat
    numbers already used.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._next = 1

    def set(self, step: int) -> None:
        with self._lock:
            self._next = int(step)

    def take(self) -> int:
        propagated = step_number()  # rollout.step baggage the trainer put in this context
        with self._lock:
            number = propagated if propagated is not None else self._next
            self._next = number + 1
            return number


_AUTO_STEPS = _AutoSteps()


def set_step(step: int) -> None:
    """Number the next step ``OTEL_ROLLOUT_BATCH_AS_STEP`` makes ``step`` (later ones follow on).

    Call it with the trainer's global step before each rollout (or once after a resume) so the
    steps made from offline batch calls carry the trainer's numbers. ``rollout.step`` baggage in
    the call's context, if any, wins over it.
    """
    _AUTO_STEPS.set(step)


@contextmanager
def batch_step(telemetry: Telemetry) -> Iterator[None]:
    """``OTEL_ROLLOUT_BATCH_AS_STEP``: an offline call made outside any step becomes a step.

    An unmodified training loop then still gets step analytics. Steps are numbered per process,
    across engines: the ``rollout.step`` baggage of the call's context if a trainer propagated it,
    else the number given to :func:`set_step` (then counting on), else 1, 2, 3…
    """
    if not telemetry.config.batch_as_step or current_step() is not None:
        yield
        return
    with StepScope(_AUTO_STEPS.take(), config=telemetry.config, telemetry=telemetry):
        yield


@contextmanager
def batch_in_step(telemetry: Telemetry, model: str, operation: str, size: int) -> Iterator[Context]:
    """An offline call's batch span (inside a step of its own with ``BATCH_AS_STEP``)."""
    with batch_step(telemetry), telemetry.batch(model, operation, size) as ctx:
        yield ctx
