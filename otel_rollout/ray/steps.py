"""One step across Ray processes: actors report their requests back to the step's owner.

The driver opens ``rollout_step(i)``; its requests run in actors two hops away (verl: trainer →
``AgentLoopWorker`` → server actor holding the engine). The step's analytics need every record,
so they travel back through Ray itself — a small named actor per job (:class:`StepCollector`,
``num_cpus=0``) — not through a network service of our own and not through a shared filesystem.

Causality makes the wait short: a remote call made under a step reports its process's records
for that step *before it returns* (:func:`remote_call`), so by the time the driver's
``ray.get`` returns, every record of a finished call has already reached the collector, and the
step's end is one actor call. Calls are counted as they are made (caller side) and as they
report (callee side); a call that never reports (its worker died, or it outlives the step) is
waited for at most ``OTEL_ROLLOUT_STEP_WAIT`` seconds, then the step is closed as partial with
the records that are known.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
import uuid
from collections.abc import AsyncIterator, Iterator, Mapping
from contextlib import asynccontextmanager, contextmanager
from typing import TYPE_CHECKING, Any

from opentelemetry import baggage
from opentelemetry import context as otel_context

from otel_rollout.context import current_step, with_step
from otel_rollout.guard import LogOnce
from otel_rollout.propagation import extract_context
from otel_rollout.semconv import BAGGAGE_STEP_KEY

if TYPE_CHECKING:
    from opentelemetry.context import Context

    from otel_rollout.record import RequestRecord
    from otel_rollout.steps import StepScope

_logger = logging.getLogger(__name__)
_log = LogOnce()

COLLECTOR_NAME = "otel_rollout_step_collector"
COLLECTOR_NAMESPACE = "otel_rollout"
REPORT_TIMEOUT_S = 30.0
"""A callee waits at most this long for its report to be accepted before it returns anyway."""


class StepCollector:
    """The job's mailbox for step reports (a Ray actor): records and call counts per step key."""

    def __init__(self) -> None:
        self._steps: dict[str, dict[str, Any]] = {}

    def report(self, key: str, records: list[RequestRecord], started: int, finished: int) -> int:
        entry = self._steps.setdefault(key, {"records": [], "started": 0, "finished": 0})
        entry["records"].extend(records)
        entry["started"] += started
        entry["finished"] += finished
        return len(entry["records"])

    def drain(self, key: str) -> tuple[list[RequestRecord], int, int]:
        """Everything reported for ``key`` so far (records are handed over once)."""
        entry = self._steps.get(key)
        if entry is None:
            return [], 0, 0
        records, entry["records"] = entry["records"], []
        return records, entry["started"], entry["finished"]

    def forget(self, key: str) -> None:
        self._steps.pop(key, None)


@dataclasses.dataclass
class _Pending:
    records: list[RequestRecord] = dataclasses.field(default_factory=list)
    started: int = 0


class _Local:
    """This process's side of every open step: its outgoing calls and unreported records."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.pending: dict[str, _Pending] = {}
        self.collector: Any = None

    def call_started(self, key: str) -> None:
        with self.lock:
            self.pending.setdefault(key, _Pending()).started += 1

    def add(self, key: str, record: RequestRecord) -> None:
        with self.lock:
            self.pending.setdefault(key, _Pending()).records.append(_portable(record))

    def take(self, key: str) -> _Pending:
        with self.lock:
            return self.pending.pop(key, None) or _Pending()

    def handle(self, create: bool = False) -> Any:
        if self.collector is None:
            import ray

            options: dict[str, Any] = {"name": COLLECTOR_NAME, "namespace": COLLECTOR_NAMESPACE}
            if create:
                remote = ray.remote(num_cpus=0, max_concurrency=64)(StepCollector)
                self.collector = remote.options(get_if_exists=True, **options).remote()
            else:
                self.collector = ray.get_actor(**options)
        return self.collector


LOCAL = _Local()


def _portable(record: RequestRecord) -> RequestRecord:
    """A copy that pickles and carries no content: the error becomes its finish reason."""
    reason = record.finish_reason
    return dataclasses.replace(record, error=None, prompt_text=None, completion_texts=(),
                               finish_reasons=(reason,) if reason else ())


def _ray_ready() -> bool:
    import sys

    ray = sys.modules.get("ray")
    return ray is not None and bool(ray.is_initialized())


# --- the driver's side: a step channel ---------------------------------------------------------

@dataclasses.dataclass
class _Remote:
    records: list[RequestRecord]
    missing_calls: int


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
        records: list[RequestRecord] = list(own.records)
        deadline = time.monotonic() + wait_s
        while True:
            got, started, finished = ray.get(collector.drain.remote(key),
                                             timeout=max(1.0, wait_s))
            records.extend(got)
            missing = own.started + started - finished
            if missing <= 0 or time.monotonic() >= deadline:
                break
            time.sleep(min(0.05, max(0.0, deadline - time.monotonic())))
        collector.forget.remote(key)
        if missing > 0:
            _logger.warning("otel_rollout: step %s: %d remote call(s) did not report their requests "
                            "within %.1f s (OTEL_ROLLOUT_STEP_WAIT); the step is reported as "
                            "partial with the %d requests known", scope.step, missing, wait_s,
                            len(records))
        return _Remote(records, max(0, missing))


# --- the actors' side ------------------------------------------------------------------------

class RemoteStep:
    """Stands in for the driver's step scope in an actor: collects the step's records here."""

    __slots__ = ("key", "step")

    def __init__(self, key: str, step: int | None) -> None:
        self.key = key
        self.step = step

    def observe(self, record: RequestRecord) -> None:
        LOCAL.add(self.key, record)


def step_key(ctx: Context | None = None) -> str | None:
    value = baggage.get_baggage(BAGGAGE_STEP_KEY, ctx)
    return str(value) if value else None


def call_started(ctx: Context | None = None) -> None:
    """A remote call is being made from this process; count it against the open step."""
    key = step_key(ctx)
    if key is not None:
        LOCAL.call_started(key)


def _enter(carrier: Mapping[str, str]) -> tuple[object, str | None]:
    ctx = extract_context(carrier)
    key = step_key(ctx)
    if key is not None and current_step(ctx) is None:
        from otel_rollout.context import step_number

        ctx = with_step(RemoteStep(key, step_number(ctx)), ctx)
    return otel_context.attach(ctx), key


def _payload(key: str) -> tuple[list[RequestRecord], int]:
    pending = LOCAL.take(key)
    return pending.records, pending.started


@contextmanager
def remote_call(carrier: Mapping[str, str]) -> Iterator[None]:
    """Run an actor method in the caller's context; report the step's records before returning."""
    token, key = _enter(carrier)
    try:
        yield
    finally:
        otel_context.detach(token)  # type: ignore[arg-type]
        if key is not None:
            with _log.guard("step report"):
                import ray

                records, started = _payload(key)
                ray.get(LOCAL.handle().report.remote(key, records, started, 1),
                        timeout=REPORT_TIMEOUT_S)


@asynccontextmanager
async def remote_call_async(carrier: Mapping[str, str]) -> AsyncIterator[None]:
    """:func:`remote_call` for async actor methods: the report is awaited, not blocked on."""
    token, key = _enter(carrier)
    try:
        yield
    finally:
        otel_context.detach(token)  # type: ignore[arg-type]
        if key is not None:
            with _log.guard("step report"):
                import asyncio

                records, started = _payload(key)
                ref = LOCAL.handle().report.remote(key, records, started, 1)
                await asyncio.wait_for(asyncio.wrap_future(ref.future()), REPORT_TIMEOUT_S)
