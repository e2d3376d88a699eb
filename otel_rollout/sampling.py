"""Step-aware sampling of request spans: keep the stragglers, drop the bulk (issue #19).

Every request of a step shares the step's trace, so a Collector's tail sampling, which decides
per trace, keeps or drops a whole step: its latency policy sees the step's duration, and one
truncated request keeps all of them. The package knows better: a request span is made after the
request finished, with its step's progress at hand. So the decision is made here, in the caller,
before the request's span or metric points exist, from what the step has seen in this process:

* a step with at most ``min_step`` requests started keeps every span (small steps are cheap);
* an error or an abort is always kept, and so is a truncation (``length``) while the step's
  truncations kept at once are fewer than its tail is (:func:`truncation_budget`): where nearly
  every request is truncated (an RL step whose ``max_tokens`` is too short), a span for each
  made sampling nothing — beyond that budget a truncation is sampled as any other request
  (the tail, the rate, the longest), and still counted;
* the step's tail is kept: the requests that finished after ``tail`` of the step's requests had,
  the ones the GPUs waited for. When the step's requests are submitted together (an RL batch:
  verl's, NeMo-RL's, slime's) the last to finish are also the slowest;
* of the rest, a ``rate`` share: every ``1/rate``-th in the order they finished, so exactly that
  share, spread evenly over the step's latencies (no random state, nothing shared);
* of what that left out, the ``slowest`` longest requests of the step. An agentic step's
  requests start throughout, so its longest need not finish last.

The tail and the longest are known only when the step ends, so a step open in this process
decides them then. Each finished request waits in the step's tail window (the latest
``1 - tail`` of the requests started so far by finish time, whatever order they were handed
over in, at most :data:`TAIL_WINDOW_MAX`) until later finishers push it out; then the rate
decides, and what that leaves out waits for one of the ``slowest`` places. Every request
competes for those, kept or not (a longer one pushes the shortest out; a waiting one pushed out
is dropped), so a place goes only to one of the step's longest: in a batch those are its tail,
and the places add no span. At the step's end what is still in the window is the tail, kept,
and what waits in a place is kept. Deciding from the count so far instead fails both shapes:
in an agentic step the requests in flight are always a few per cent of those started, so every
finisher looked like the tail (69 % of an agentic test step's spans were kept), and in a batch
every finisher is the slowest so far. A waiting request's span and metric points wait with it;
a flush or the process's exit decides at once and keeps what waits (:func:`release_all`), so a
provider's ``force_flush`` still delivers every record taken.

A step open in another process — known here by its number (``rollout.step`` baggage: an engine
server) or as a Ray actor's stand-in for the driver's step (its step key) — has no end in this
process: it decides each request at once (:func:`decide`), its tail judged by what this process
has seen so far — finished after ``tail`` of those started here, and among the longest
``1 - tail`` of those finished (:meth:`StepSampling.decide`) — and keeps no ``slowest``.

Metric points are recorded for every request whatever is decided (counts stay exact); only a
kept span is named by an exemplar. The step span itself is never sampled.

:func:`decide` is the rule at once, pure; :class:`StepSampling` is one step's running state;
:func:`state_of` finds the state of a record's step: the local ``rollout_step``'s, or one per
step number for a step known by its baggage, the last :data:`REMOTE_STEPS` kept.
"""

from __future__ import annotations

import heapq
import itertools
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

from otel_rollout.context import StepView
from otel_rollout.quantiles import tail_size, tail_start_index
from otel_rollout.record import FINISH_ABORT, FINISH_LENGTH, RequestRecord

if TYPE_CHECKING:
    from opentelemetry.context import Context

REMOTE_STEPS = 16
"""Steps known by number only whose sampling state a process keeps (the newest ones)."""

TAIL_WINDOW_MAX = 10_000
"""Finished requests a step's tail window holds at most (5 % of a 200,000-request step): what
waits is bounded. Beyond it, the earliest of the tail are decided before the step's end."""

Submit = Callable[[Sequence[RequestRecord], "Context"], None]
"""Hands decided records on to be emitted (their telemetry's), under their parent context."""

SLOWEST = "slowest"
"""The reason of a span kept as one of its step's longest requests, decided at the step's end."""


@dataclass(frozen=True)
class SamplingPolicy:
    rate: float = 0.02
    """``OTEL_ROLLOUT_SAMPLE_RATE``; 1 keeps every span."""
    tail: float = 0.9
    """``OTEL_ROLLOUT_TAIL_QUANTILE``: the tail kept is the tail the step's analytics name."""
    min_step: int = 64
    slowest: int = 5

    @property
    def keeps_all(self) -> bool:
        return self.rate >= 1.0


def rate_pick(seen: int, rate: float) -> bool:
    """Whether the rest's request number ``seen`` (from 0, in finish order) is kept: every
    ``1/rate``-th. Exactly the share, with no variance: a random pick of 2 % of a 300-request
    step's rest varies by ±2 spans, as much as the step's truncations."""
    return int((seen + 1) * rate) > int(seen * rate)


def truncation_budget(started: int, policy: SamplingPolicy) -> int:
    """How many truncations a step keeps at once: as many as its tail holds (at least
    ``min_step``). Truncations beyond it are sampled like any other request."""
    return max(policy.min_step, tail_size(started, policy.tail))


def _at_once(record: RequestRecord, truncations_kept: int = 0, budget: int = 0) -> str | None:
    """Kept whatever the step does: errors, aborts, and truncations within their ``budget``
    (``truncations_kept`` of the step's so far)."""
    if record.error is not None:
        return "error"
    reason = record.finish_reason
    if reason == FINISH_ABORT:
        return "error"
    if reason == FINISH_LENGTH and truncations_kept < budget:
        return "truncated"
    return None


def decide(
    record: RequestRecord,
    policy: SamplingPolicy,
    started: int,
    slow: bool,
    rest_before: int = 0,
    truncations_kept: int = 0,
) -> str | None:
    """Why ``record``'s span is kept, or ``None`` if it is not, decided at once: its step had
    ``started`` requests, ``slow``: it is among the step's slowest so far (its tail, as far as
    this process can tell), ``rest_before`` of the step's requests were neither kept at once nor
    the tail, ``truncations_kept`` truncations were kept at once. For a step with no end in this
    process; a step open here waits for its end (:meth:`StepSampling.take`)."""
    if policy.keeps_all or started <= policy.min_step:
        return "all"
    now = _at_once(record, truncations_kept, truncation_budget(started, policy))
    if now is not None:
        return now
    if slow:
        return "tail"
    if rate_pick(rest_before, policy.rate):
        return "rate"
    return None


class Waiting(NamedTuple):
    """A finished request whose sampling waits for its step: what hands it on once decided."""

    record: RequestRecord
    parent: Any  # the Context it is emitted under
    submit: Submit


class StepSampling:
    """One step's running state in this process. ``holds``: the step is open here and its end
    calls :meth:`release`, so its tail and its slowest are decided then (:meth:`take`)."""

    __slots__ = (
        "_lock",
        "_places",
        "_rest",
        "_seq",
        "_slowest",
        "_small",
        "_truncated",
        "_high",
        "_low",
        "_window",
        "done",
        "holds",
        "started",
    )

    def __init__(self, holds: bool = False) -> None:
        self.started = 0
        self.done = 0
        self.holds = holds
        # the latest finishers by their finish time, a min-heap: the tail if the step ended now.
        # By time, not by when each was handed over: a stream's caller may see two requests of
        # one engine iteration in either order, and the tail is the analysis's, by finish time.
        self._window: list[tuple[int, int, Waiting]] = []
        # a step with no end here: its longest durations so far, and the rest (negated)
        self._high: list[int] = []
        self._low: list[int] = []
        # the step's longest so far, a min-heap by duration; None: a request kept anyway
        self._slowest: list[tuple[int, int, Waiting | None]] = []
        self._seq = itertools.count()
        self._small = True  # at most min_step requests so far: every span is kept
        self._places = 0  # the policy's slowest, as of the last request taken
        self._rest = 0  # requests the rate picked from so far
        self._truncated = 0  # truncations kept at once so far
        self._lock = threading.Lock()

    def requests_started(self, count: int) -> None:
        with self._lock:
            self.started += count

    @property
    def waiting(self) -> int:
        """Finished requests whose sampling waits for the step's end."""
        return len(self._window) + sum(e[2] is not None for e in self._slowest)

    def decide(self, record: RequestRecord, policy: SamplingPolicy) -> str | None:
        """At once (a step open in another process): :func:`decide` with the counts so far.

        With no end here a finisher cannot know what finishes after it, so its tail is judged
        two ways, and must pass both: it finished after ``tail`` of the requests started here
        so far had, and it is among the longest ``1 - tail`` of those seen finish. Finish order
        alone fails where requests keep arriving (one Ray call a sample, agentic turns): the few
        in flight made every finisher look like the tail (measured: every span of a
        4,096-request step kept). Duration alone fails a batch handed over in finish order:
        each finisher is the longest so far. In a batch the two agree on its last finishers;
        where requests keep arriving, duration picks its longest."""
        with self._lock:
            done_before = self.done
            self.done += 1
            started = max(self.started, self.done)
            longest = self._among_longest(record.finish_ns - record.arrival_ns, policy)
            slow = longest and done_before > tail_start_index(started, policy.tail)
            reason = decide(record, policy, started, slow, self._rest, self._truncated)
            if reason is None or reason == "rate":
                self._rest += 1
            elif reason == "truncated":
                self._truncated += 1
        return reason

    def _among_longest(self, duration: int, policy: SamplingPolicy) -> bool:
        """Whether ``duration`` is among the longest ``1 - tail`` of those seen so far. Two
        heaps: the longest (a min-heap, as many as the tail is, at most :data:`TAIL_WINDOW_MAX`)
        and the rest (a max-heap, of which only the longest can ever move up, so it is cut back
        to that many when it doubles): bounded, and exact while it holds."""
        high, low = self._high, self._low
        if high and duration > high[0]:
            heapq.heappush(high, duration)
        else:
            heapq.heappush(low, -duration)
        keep = min(tail_size(self.done, policy.tail), TAIL_WINDOW_MAX)
        while len(high) > keep:
            heapq.heappush(low, -heapq.heappop(high))
        while len(high) < keep and low:
            heapq.heappush(high, -heapq.heappop(low))
        if len(low) > 2 * TAIL_WINDOW_MAX:
            self._low = heapq.nsmallest(TAIL_WINDOW_MAX, low)  # sorted: a valid heap
        return bool(high) and duration >= high[0]

    def take(
        self, record: RequestRecord, parent: Context, submit: Submit, policy: SamplingPolicy
    ) -> list[Waiting]:
        """A finished request of a step open here. Returns the requests decided by this call,
        ``record`` itself where it needs no waiting, each with its ``kept`` set (``None``: no
        span, and its ``span_id`` cleared): they are to be handed on now. ``record`` waits
        otherwise."""
        this = Waiting(record, parent, submit)
        with self._lock:
            self.done += 1
            started = max(self.started, self.done)
            self._small = started <= policy.min_step
            self._places = policy.slowest
            now = _at_once(record, self._truncated, truncation_budget(started, policy))
            if now == "truncated":
                self._truncated += 1
            if now is not None or not self.holds:  # not holds: the step ended meanwhile
                record.kept = now or "tail"
                lost = self._place(record, None)
                return [this] if lost is None else [this, _dropped(lost)]
            _WAITING.add(self)
            heapq.heappush(self._window, (record.finish_ns, next(self._seq), this))
            # A step of at most min_step keeps every span: until it has more, every finisher waits.
            room = (
                policy.min_step
                if self._small
                else min(tail_size(started, policy.tail), TAIL_WINDOW_MAX)
            )
            decided: list[Waiting] = []
            while len(self._window) > room:
                out = heapq.heappop(self._window)[2]  # later finishers pushed it out of the tail
                self._rest += 1
                if rate_pick(self._rest - 1, policy.rate):
                    out.record.kept = "rate"
                    decided.append(out)
                    lost = self._place(out.record, None)
                else:
                    lost = self._place(out.record, out)
                if lost is not None:
                    decided.append(_dropped(lost))
            return decided

    def _place(self, record: RequestRecord, waiting: Waiting | None) -> Waiting | None:
        """Offer a finished request to the step's ``slowest`` places (by duration); ``waiting``
        ``None``: it is kept anyway. Every request competes, kept or not, so a place goes to one
        of the step's longest only: in a batch those are its tail, and no place adds a span.
        Returns a waiting request without a place (pushed out, or never in): dropped."""
        if self._places <= 0:
            return waiting
        entry = (record.finish_ns - record.arrival_ns, next(self._seq), waiting)
        if len(self._slowest) < self._places:
            heapq.heappush(self._slowest, entry)
            return None
        if entry[0] <= self._slowest[0][0]:
            return waiting
        return heapq.heapreplace(self._slowest, entry)[2]

    def release(self, final: bool = False) -> int:
        """The step ended (``final``: nothing waits after it) or a flush came: what waits is
        decided now and handed on. The window is the tail (kept; it competes for the slowest
        places too), the requests still placed are the slowest (kept), the rest lost their
        place (dropped). Returns how many were handed on."""
        with self._lock:
            window = [entry[2] for entry in self._window]
            self._window = []
            lost = []
            for waiting in window:
                waiting.record.kept = "all" if self._small else "tail"
                out = self._place(waiting.record, None)
                if out is not None:
                    lost.append(_dropped(out))
            placed = [e[2] for e in self._slowest if e[2] is not None]
            # what holds a place is kept from now on: it still competes, as a kept one
            self._slowest = [(d, n, None) for d, n, _ in self._slowest]
            _WAITING.discard(self)
            if final:
                self.holds = False
                self._slowest = []
        for waiting in placed:
            waiting.record.kept = SLOWEST
        decided = sorted(window + placed + lost, key=lambda w: w.record.finish_ns)
        for waiting in decided:
            waiting.submit((waiting.record,), waiting.parent)
        return len(decided)


def _dropped(waiting: Waiting) -> Waiting:
    waiting.record.kept = None
    waiting.record.span_id = 0  # no span: nothing may name one
    return waiting


_WAITING: set[StepSampling] = set()
"""Steps with requests waiting: a flush or the exit decides for them (:func:`release_all`).
Held strongly: a step left open and dropped still owes its waiting requests' counts."""


def release_all() -> int:
    """Decide now for every request waiting in a step: keep it (a provider's ``force_flush`` and
    the exit deliver every record taken). Returns how many."""
    return sum(state.release() for state in list(_WAITING))


_REMOTE: OrderedDict[int | str, StepSampling] = OrderedDict()
_LOCK = threading.Lock()


def remote_state(step: int | str) -> StepSampling:
    """The state of a step open in another process, by its number (baggage) or its Ray step key:
    the newest ones are kept."""
    with _LOCK:
        state = _REMOTE.get(step)
        if state is None:
            state = _REMOTE[step] = StepSampling()
            while len(_REMOTE) > REMOTE_STEPS:
                _REMOTE.popitem(last=False)
        return state


def state_of(view: StepView) -> StepSampling | None:
    """The sampling state of the step of a context (its
    :func:`~otel_rollout.context.step_view`): its local ``rollout_step``'s, or by the step's
    number (baggage) where the step is open in another process; ``None`` outside any step."""
    if view.step is not None:
        return getattr(view.step, "sampling", None)
    return None if view.number is None else remote_state(view.number)
