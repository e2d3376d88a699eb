"""One step across Ray processes: actors report their requests back to the step's owner.

The driver opens ``rollout_step(i)``; its requests run in actors two hops away (verl: trainer →
``AgentLoopWorker`` → server actor holding the engine). The step's analytics need every record,
so they travel back through Ray itself — a small named actor per job (:class:`StepCollector`,
``num_cpus=0``) — not through a network service of our own and not through a shared filesystem.

Causality makes the wait short: a remote call made under a step sends its process's records for
that step *as it returns* (:func:`remote_call`), so by the time the driver's ``ray.get`` returns,
every finished call's report is already on its way, and the step's end is one or a few actor
calls. Calls are counted as they are made (caller side) and as they report (callee side); a call
that never reports (its worker died, or it outlives the step) is waited for at most
``OTEL_ROLLOUT_STEP_WAIT`` seconds, then the step is closed as partial with the records that are
known.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import os
import threading
import time
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from opentelemetry import baggage, trace
from opentelemetry import context as otel_context

from otel_rollout.context import current_step, with_step
from otel_rollout.guard import LogOnce
from otel_rollout.propagation import extract_context
from otel_rollout.record import RequestRecord, TrajectoryRecord
from otel_rollout.sampling import StepSampling, remote_state
from otel_rollout.semconv import BAGGAGE_STEP_KEY

if TYPE_CHECKING:
    from opentelemetry.context import Context

    from otel_rollout.steps import StepScope

_logger = logging.getLogger(__name__)
_log = LogOnce()

COLLECTOR_NAME = "otel_rollout_step_collector"
COLLECTOR_NAMESPACE = "otel_rollout"


@dataclasses.dataclass
class _Pending:
    """Records and the ids of calls started / finished, per step key.

    Ids, not counts: reports from different processes arrive in any order (a server's "finished"
    before the intermediate worker's "started"), and only sets make "every known call has
    finished" a test that can never pass early.
    """

    records: list[RequestRecord | TrajectoryRecord] = dataclasses.field(default_factory=list)
    """Requests, and the trajectories that ended in the step (both travel in one report)."""
    started: set[str] = dataclasses.field(default_factory=set)
    finished: set[str] = dataclasses.field(default_factory=set)


class StepCollector:
    """The job's mailbox for step reports (a Ray actor): records and call counts per step key."""

    def __init__(self) -> None:
        self._steps: dict[str, _Pending] = {}

    def report(
        self,
        key: str,
        records: list[RequestRecord | TrajectoryRecord],
        started: set[str],
        finished: set[str],
    ) -> None:
        entry = self._steps.setdefault(key, _Pending())
        entry.records.extend(records)
        entry.started |= started
        entry.finished |= finished

    def drain(self, key: str) -> tuple[list[RequestRecord | TrajectoryRecord], set[str], set[str]]:
        """Everything reported for ``key`` so far (records are handed over once)."""
        entry = self._steps.get(key)
        if entry is None:
            return [], set(), set()
        records, entry.records = entry.records, []
        return records, set(entry.started), set(entry.finished)

    def forget(self, key: str) -> None:
        self._steps.pop(key, None)


SPAN_FLUSH_TIMEOUT_MS = 1000
COLLECTOR_START_S = 60.0
"""How long a step's end waits for the job's collector to answer the first time: the actor is
started with the job's first step (a worker process of its own, seconds on a busy node), and the
reports of that step are queued to it, so its start is waited for rather than read as lost calls;
``OTEL_ROLLOUT_STEP_WAIT`` counts from its first answer."""
FLUSH_INTERVAL_S = 0.02
"""How often an actor process sends what its finished calls collected: one report for many calls."""


class _Local:
    """This process's side of every open step: its outgoing calls and unreported records."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.pending: dict[str, _Pending] = {}
        self.collector: Any = None
        self._wake = threading.Event()
        self._ids = itertools.count()
        self._flusher: threading.Thread | None = None
        self.collector_job: str | None = None
        self.collector_answered = False

    def call_finished(self, key: str, call_id: str) -> None:
        """A call served here ended: its records go out with the next report (batched)."""
        with self.lock:
            self.pending.setdefault(key, _Pending()).finished.add(call_id)
            if self._flusher is None or not self._flusher.is_alive():
                self._flusher = threading.Thread(
                    target=self._flush_loop, daemon=True, name="otel_rollout-step-reports"
                )
                self._flusher.start()
        self._wake.set()

    def _flush_loop(self) -> None:
        while True:
            self._wake.wait()
            time.sleep(FLUSH_INTERVAL_S)  # let calls finishing together share one report
            self._wake.clear()
            with self.lock:
                ready = {k: p for k, p in self.pending.items() if p.finished}
                for key in ready:
                    del self.pending[key]
            if not ready:
                continue
            # Export the calls' spans before saying they are done: when the step's owner has
            # every report, the step's request spans have left this process (an actor may be
            # killed right after the job's last step). Bounded: a stuck exporter only delays.
            # Only where a span was made: at RL scale most reports carry none (sampling kept
            # 4 % of a step's), and a flush is an export call of its own each time.
            if any(_has_span(pending.records) for pending in ready.values()):
                with _log.guard("span flush before step report"):
                    flush = getattr(trace.get_tracer_provider(), "force_flush", None)
                    if flush is not None:
                        flush(SPAN_FLUSH_TIMEOUT_MS)
            for key, pending in ready.items():
                with _log.guard("step report"):
                    self.handle().report.remote(
                        key, pending.records, pending.started, pending.finished
                    )

    def call_started(self, key: str) -> str:
        call_id = f"{os.getpid()}-{next(self._ids)}"
        with self.lock:
            self.pending.setdefault(key, _Pending()).started.add(call_id)
        return call_id

    def add(self, key: str, record: RequestRecord | TrajectoryRecord) -> None:
        portable = _portable(record) if isinstance(record, RequestRecord) else record
        with self.lock:
            self.pending.setdefault(key, _Pending()).records.append(portable)

    def take(self, key: str) -> _Pending:
        with self.lock:
            return self.pending.pop(key, None) or _Pending()

    def handle(self, create: bool = False) -> Any:
        import ray

        # One per job: drivers sharing a cluster (and the namespace) each get their own, owned by
        # their driver, so one job's exit does not take another's reports with it; a process
        # that shuts Ray down and starts a new job gets the new job's.
        job = ray.get_runtime_context().get_job_id()
        if self.collector is None or self.collector_job != job:
            options: dict[str, Any] = {
                "name": f"{COLLECTOR_NAME}_{job}",
                "namespace": COLLECTOR_NAMESPACE,
            }
            if create:
                remote = ray.remote(num_cpus=0, max_concurrency=64)(StepCollector)
                self.collector = remote.options(get_if_exists=True, **options).remote()
            else:
                self.collector = ray.get_actor(**options)
            self.collector_job = job
            self.collector_answered = False
        return self.collector


LOCAL = _Local()


def _has_span(records: list[RequestRecord | TrajectoryRecord]) -> bool:
    """Whether any of a report's records has a span made in this process (a request that
    sampling did not drop; a trajectory, whose spans are always made)."""
    return any(not isinstance(r, RequestRecord) or r.kept is not None for r in records)


def _portable(record: RequestRecord) -> RequestRecord:
    """A copy that pickles and carries no content: the error becomes its finish reason."""
    reason = record.finish_reason
    return dataclasses.replace(
        record,
        error=None,
        prompt_text=None,
        completion_texts=(),
        finish_reasons=(reason,) if reason else (),
    )


def _ray_ready() -> bool:
    import sys

    ray = sys.modules.get("ray")
    return ray is not None and bool(ray.is_initialized())


# --- the driver's side: a step channel ---------------------------------------------------------


@dataclasses.dataclass
class _Remote:
    records: list[RequestRecord]
    missing_calls: int
    trajectories: list[TrajectoryRecord]


class RayStepChannel:
    """Registered with :mod:`otel_rollout.steps` by the Ray instrumentor."""

    def __init__(self) -> None:
        self._keys: dict[int, str] = {}

    def open(self, scope: StepScope, ctx: Context) -> Context:
        if not _ray_ready():
            return ctx
        key = uuid.uuid4().hex
        LOCAL.handle(create=True)
        self._keys[id(scope)] = key
        return baggage.set_baggage(BAGGAGE_STEP_KEY, key, ctx)

    def close(self, scope: StepScope, wait_s: float) -> _Remote | None:
        key = self._keys.pop(id(scope), None)
        if key is None:
            return None
        import ray

        own = LOCAL.take(key)  # calls this process made, records it holds for its own step
        collector = LOCAL.handle()
        records: list[RequestRecord | TrajectoryRecord] = list(own.records)
        deadline = time.monotonic() + wait_s
        while True:
            starting = not LOCAL.collector_answered
            answer = COLLECTOR_START_S if starting else max(1.0, wait_s)
            got, started, finished = ray.get(collector.drain.remote(key), timeout=answer)
            LOCAL.collector_answered = True
            if starting:
                # Reports queued while the collector started reach it only now: the wait for
                # them starts when it can take them, not when the step ended.
                deadline = time.monotonic() + wait_s
            records.extend(got)
            missing = len((own.started | started) - finished)
            if not missing or time.monotonic() >= deadline:
                break
            time.sleep(min(0.05, max(0.0, deadline - time.monotonic())))
        collector.forget.remote(key)
        if missing:
            _logger.warning(
                "otel_rollout: step %s: %d remote call(s) did not report their requests "
                "within %.1f s (OTEL_ROLLOUT_STEP_WAIT); the step is reported as "
                "partial with the %d requests known",
                scope.step,
                missing,
                wait_s,
                len(records),
            )
        requests = [r for r in records if isinstance(r, RequestRecord)]
        trajectories = [r for r in records if isinstance(r, TrajectoryRecord)]
        return _Remote(requests, max(0, missing), trajectories)


# --- the actors' side ------------------------------------------------------------------------


class RemoteStep:
    """Stands in for the driver's step scope in an actor: collects the step's records here, and
    samples their spans as a step open in another process does (at once, by its key)."""

    __slots__ = ("key", "step")

    def __init__(self, key: str, step: int | None) -> None:
        self.key = key
        self.step = step

    @property
    def sampling(self) -> StepSampling:
        """The step's sampling state in this process, shared by every call made under it."""
        return remote_state(self.key)

    def observe(self, record: RequestRecord) -> None:
        LOCAL.add(self.key, record)

    def observe_trajectory(self, trajectory: TrajectoryRecord) -> None:
        LOCAL.add(self.key, trajectory)

    def requests_started(self, count: int) -> None:
        """Counted for the step's sampling here. Live progress is the driver's view of its own
        process; an actor's engines report theirs (silence, oldest age) as its metrics."""
        remote_state(self.key).requests_started(count)


def step_key(ctx: Context | None = None) -> str | None:
    value = baggage.get_baggage(BAGGAGE_STEP_KEY, ctx)
    return str(value) if value else None


CALL_ID = "otel_rollout_call"
"""The carrier entry naming one remote call, so its owner can tell when it has reported."""


def call_started(ctx: Context | None = None) -> str | None:
    """A remote call is being made from this process under a step: its id, to put in the carrier."""
    key = step_key(ctx)
    return LOCAL.call_started(key) if key is not None else None


ENTERED_MAX = 64
"""Distinct carriers whose continued context a process keeps (:func:`_continued`)."""

_ENTERED: dict[tuple[tuple[str, str], ...], tuple[Context, str | None]] = {}


def _continued(carrier: Mapping[str, str]) -> tuple[Context, str | None]:
    """The context a call's carrier continues, and its step key: made once per distinct carrier.

    A step's calls from one caller carry the same context (the call's own id aside): thousands
    of calls a step, each extracting the same ``traceparent`` and ``baggage`` again, cost a
    server actor's event loop more than the rest of a call's bookkeeping. One context object
    for them all also lets :func:`~otel_rollout.context.step_view` find its step cached.
    """
    try:
        entry = tuple(item for item in carrier.items() if item[0] != CALL_ID)
        hit = _ENTERED.get(entry)
    except TypeError:  # a value that cannot be a key: made for this call alone
        entry, hit = None, None
    if hit is not None:
        return hit
    ctx = extract_context(carrier)
    key = step_key(ctx)
    if key is not None and current_step(ctx) is None:
        from otel_rollout.context import step_number

        ctx = with_step(RemoteStep(key, step_number(ctx)), ctx)
    if entry is not None:
        if len(_ENTERED) >= ENTERED_MAX:
            _ENTERED.clear()  # old steps' contexts: the next calls make theirs again
        _ENTERED[entry] = (ctx, key)
    return ctx, key


def _enter(carrier: Mapping[str, str]) -> tuple[object, str | None]:
    ctx, key = _continued(carrier)
    return otel_context.attach(ctx), key


@contextmanager
def remote_call(carrier: Mapping[str, str]) -> Iterator[None]:
    """Run an actor method in the caller's context; send the step's records as it returns.

    The report is sent by a background thread, batched over the calls that end within a few
    milliseconds of each other, and never awaited: one actor call per served call would double
    the cost of a Ray call, and the step's owner waits (boundedly) for every started call to have
    reported anyway.
    """
    token, key = _enter(carrier)
    call_id = carrier.get(CALL_ID)
    try:
        yield
    finally:
        otel_context.detach(token)  # type: ignore[arg-type]
        if key is not None and call_id is not None:
            with _log.guard("step report"):
                LOCAL.call_finished(key, call_id)
