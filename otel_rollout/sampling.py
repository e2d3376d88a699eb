"""Step-aware sampling of request spans: keep the stragglers, drop the bulk (issue #19).

Every request of a step shares the step's trace, so a Collector's tail sampling, which decides
per trace, keeps or drops a whole step: its latency policy sees the step's duration, and one
truncated request keeps all of them. The package knows better: a request span is made after the
request finished, with its step's progress at hand. So the decision is made here, when the
request is handed over (in the caller, before its span or metric points exist), from what the
step has seen so far in this process:

* a step with at most ``min_step`` requests started keeps every span (small steps are cheap);
* an error, an abort or a truncation (``length``) is always kept;
* a request finishing after ``tail`` of the requests started had finished is kept: the step's
  stragglers, the ones the GPUs waited for. When the step's requests are submitted together (an
  RL batch: verl's, NeMo-RL's, slime's), the last to finish are also the slowest, so the step's
  slowest are kept;
* of the rest, a ``rate`` share, chosen by the span id (deterministic, no shared random state).

Metric points are recorded for every request whatever is decided (counts stay exact); only a
kept span is named by an exemplar. The step span itself is never sampled.

:func:`decide` is the rule, pure; :class:`StepSampling` is one step's running state (started,
done); :func:`state_for` finds the state of a record's step: the local
``rollout_step``'s, or for a step known only by its ``rollout.step`` baggage (an engine server, a
Ray actor) one per step number, the last :data:`REMOTE_STEPS` kept.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING

from otel_rollout.context import current_step, step_number
from otel_rollout.record import FINISH_ABORT, FINISH_LENGTH, RequestRecord

if TYPE_CHECKING:
    from opentelemetry.context import Context

REMOTE_STEPS = 16
"""Steps known by number only whose sampling state a process keeps (the newest ones)."""


@dataclass(frozen=True)
class SamplingPolicy:
    rate: float = 0.02
    """``OTEL_ROLLOUT_SAMPLE_RATE``; 1 keeps every span."""
    tail: float = 0.95
    min_step: int = 64

    @property
    def keeps_all(self) -> bool:
        return self.rate >= 1.0


def rate_pick(span_id: int, rate: float) -> bool:
    """A ``rate`` share of span ids, deterministically (ids are uniformly random 64-bit)."""
    return (span_id & 0xFFFF_FFFF_FFFF) < rate * 0x1_0000_0000_0000


def decide(
    record: RequestRecord, policy: SamplingPolicy, started: int, done_before: int
) -> str | None:
    """Why ``record``'s span is kept, or ``None`` if it is not: its step had ``started`` requests
    and ``done_before`` had finished before it."""
    if policy.keeps_all or started <= policy.min_step:
        return "all"
    if record.error is not None:
        return "error"
    reason = record.finish_reason
    if reason == FINISH_ABORT:
        return "error"
    if reason == FINISH_LENGTH:
        return "truncated"
    if done_before >= policy.tail * started:
        return "tail"
    if rate_pick(record.span_id, policy.rate):
        return "rate"
    return None


class StepSampling:
    """One step's running state in this process."""

    __slots__ = ("_lock", "done", "started")

    def __init__(self) -> None:
        self.started = 0
        self.done = 0
        self._lock = threading.Lock()

    def requests_started(self, count: int) -> None:
        with self._lock:
            self.started += count

    def decide(self, record: RequestRecord, policy: SamplingPolicy) -> str | None:
        with self._lock:
            done_before = self.done
            self.done += 1
            started = max(self.started, self.done)
        return decide(record, policy, started, done_before)


_REMOTE: OrderedDict[int, StepSampling] = OrderedDict()
_LOCK = threading.Lock()


def remote_state(step: int) -> StepSampling:
    """The state of a step known here by its number only (baggage): the newest ones are kept."""
    with _LOCK:
        state = _REMOTE.get(step)
        if state is None:
            state = _REMOTE[step] = StepSampling()
            while len(_REMOTE) > REMOTE_STEPS:
                _REMOTE.popitem(last=False)
        return state


def state_for(ctx: Context | None = None) -> StepSampling | None:
    """The sampling state of the step of ``ctx``: its local ``rollout_step``'s, or by the step's
    number (baggage) where the step is open in another process; ``None`` outside any step."""
    step = current_step(ctx)
    if step is not None:
        return getattr(step, "sampling", None)
    number = step_number(ctx)
    return None if number is None else remote_state(number)
