"""In-flight accounting: how many requests an engine holds now, and its busy, idle and held time.

Fully-async rollouts have no step boundaries, so an engine's idleness is exposed as monotonic
counters beside the in-flight count. Time the engine spends in a weight sync, asleep, waking or
with generation paused (:mod:`otel_rollout.engine_ops`) is *held*: neither busy nor idle, so an
idle ratio does not count a weight update as capacity wasted on stragglers.
:class:`EngineActivity` is the per-engine state the wrappers update (a lock and a clock read per
change); :class:`MeterObservers` are the observable instruments that report it, registered once
per meter for every engine telemetry on that meter.
"""

from __future__ import annotations

import operator
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from typing import Protocol

from opentelemetry.metrics import CallbackOptions, Meter, Observation

from otel_rollout.attributes import base_attributes, engine_attributes
from otel_rollout.semconv import (
    METRIC_ACTIVE,
    METRIC_ENGINE_BUSY_TIME,
    METRIC_ENGINE_HELD_TIME,
    METRIC_ENGINE_IDLE_TIME,
    METRIC_ENGINE_SILENCE,
    METRIC_ENGINE_STALLED,
    METRIC_OLDEST_AGE,
)
from otel_rollout.versions import WeightVersions


class ActivitySource(Protocol):
    """What the observers read of a member: its provider name and its engines' activity."""

    provider: str

    def activities(self) -> list[tuple[str, EngineActivity]]: ...


class EngineActivity:
    """In-flight count of one engine, and how long it has spent busy, idle or held.

    Fully-async rollouts have no step boundaries, so idleness is exposed as monotonic counters;
    ``rate(idle) / (rate(idle) + rate(busy))`` is the idle ratio. An engine is *held* while an
    engine operation runs (weight sync, sleep, wake, pause) and while it is asleep or its
    generation paused: requests in flight then wait on the operation, not on generation, so held
    time wins over busy. The in-flight count per operation feeds the observable
    ``rollout.requests.active``: a request pays a lock and a clock read here instead of two SDK
    measurements.
    """

    __slots__ = (
        "active",
        "by_operation",
        "busy_ns",
        "idle_ns",
        "held_ns",
        "operations_running",
        "states",
        "weights",
        "progress_ns",
        "probe",
        "probe_owner",
        "stalled",
        "_starts",
        "_since",
        "_entered",
        "_lock",
    )

    def __init__(self) -> None:
        self.active = 0
        self.by_operation: dict[str, int] = {}
        self.busy_ns = 0
        self.idle_ns = 0
        self.held_ns = 0
        self.operations_running = 0
        self.states: set[str] = set()
        """Lasting states set by an operation and cleared by its counterpart (``asleep``,
        ``paused``)."""
        self.weights = WeightVersions()
        """The engine's weight versions over time (:mod:`otel_rollout.versions`)."""
        self._since = time.monotonic_ns()
        self.progress_ns = self._since
        """Monotonic time of the engine's last sign of generating: an engine step that produced
        output (:meth:`progressed`), a request finished, work arrived at an idle engine, or a
        hold ended. Silence (:meth:`silence_s`) counts from here."""
        self.probe: Callable[[], float | None] | None = None
        """The engine's own wall-clock stamp of its last output, where it keeps one (SGLang's
        ``TokenizerManager.last_receive_tstamp``): read only when silence is asked for."""
        self.probe_owner = 0
        """``id`` of the engine object the probe reads: a later engine serving the same model
        (one shut down, a new one started) takes the probe over."""
        self.stalled = False
        """Set by the stall watch (:mod:`otel_rollout.stalls`) while it reports this engine
        stalled: the gauge and the log line are one decision."""
        self._starts: dict[int, int] = {}
        """Monotonic start time → requests started then and still in flight (oldest age)."""
        self._entered: dict[str, int] = {}
        """Each lasting state held now → when it was entered (epoch ns)."""
        self._lock = threading.Lock()

    def hold(self, delta: int) -> None:
        """An engine operation started (``+1``) or ended (``-1``)."""
        with self._lock:
            now = time.monotonic_ns()
            self._accrue(now)
            self.operations_running = max(0, self.operations_running + delta)
            self._unheld(now)

    def set_state(self, state: str, on: bool) -> tuple[int, int] | None:
        """Enter or leave a lasting held state (``asleep`` after sleep, until wake-up); leaving
        one, returns how long it was held (epoch ns, entered → now) for the step it fell in."""
        with self._lock:
            now = time.monotonic_ns()
            self._accrue(now)
            held: tuple[int, int] | None = None
            if on:
                self.states.add(state)
                self._entered.setdefault(state, time.time_ns())
            else:
                self.states.discard(state)
                entered = self._entered.pop(state, None)
                if entered is not None:
                    held = (entered, time.time_ns())
            self._unheld(now)
            return held

    def change(self, delta: int, operation: str = "", started_ns: int | None = None) -> int:
        """``delta`` requests started (> 0) or ended (< 0); returns the monotonic time taken.

        A start's time is handed back at its end as ``started_ns``, so the oldest request still
        in flight is known (:meth:`oldest_age_s`): stragglers are the oldest, so an end without
        it releases the oldest start, an approximation only callers that cannot tell use.
        """
        # Twice per request (its start and end): plain comparisons, not max(), on this path, and
        # busy / idle time accrued only where this change turns one into the other (between two
        # such turns the state is constant; reads accrue up to their own time, :meth:`totals`).
        if delta > 0:
            self.weights.generation_started()
        with self._lock:
            now = time.monotonic_ns()
            was = self.active
            active = was + delta
            if (was > 0) != (active > 0):
                self._accrue(now)
            self.active = active if active > 0 else 0
            ops = self.by_operation
            running = ops.get(operation, 0) + delta
            ops[operation] = running if running > 0 else 0
            if delta > 0:
                starts = self._starts
                starts[now] = starts.get(now, 0) + delta
                if was == 0:
                    self.progress_ns = now  # silence counts from when work arrived
            elif delta < 0:
                self.progress_ns = now  # a request finished: the engine is generating
                self._release(-delta, started_ns)
        return now

    def progressed(self) -> None:
        """An engine step produced output: one clock read and a store, no lock (the hot path)."""
        self.progress_ns = time.monotonic_ns()

    def held(self) -> bool:
        return self.operations_running > 0 or bool(self.states)

    def silence_s(self, now_ns: int | None = None) -> float:
        """Seconds without a sign of generating while requests are in flight; 0 when none are,
        or while the engine is held (a weight sync or a pause stops output by design)."""
        now = time.monotonic_ns() if now_ns is None else now_ns
        if self.active <= 0 or self.held():
            return 0.0
        last = self.progress_ns
        probe = self.probe
        if probe is not None:
            stamp = probe()
            if stamp:
                last = max(last, now - int((time.time() - stamp) * 1e9))
        return max(0.0, (now - last) / 1e9)

    def oldest_age_s(self, now_ns: int | None = None) -> float:
        """Age of the oldest request in flight (0 when none is)."""
        now = time.monotonic_ns() if now_ns is None else now_ns
        with self._lock:
            oldest = min(self._starts) if self._starts else None
        return 0.0 if oldest is None else max(0.0, (now - oldest) / 1e9)

    def _release(self, count: int, started_ns: int | None) -> None:
        starts = self._starts
        # The common end first, here rather than through _take: its own start, released.
        left = starts.get(started_ns, 0) if started_ns is not None else 0
        if left > count:
            starts[started_ns] = left - count  # type: ignore[index]
            count = 0
        elif left:
            del starts[started_ns]  # type: ignore[arg-type]
            count -= left
        while count > 0 and starts:
            count -= self._take(min(starts), count)
        if self.active == 0:
            starts.clear()

    def _take(self, start: int, count: int) -> int:
        """Release up to ``count`` requests of the start ``start``; returns how many."""
        left = self._starts[start]
        taken = min(count, left)
        if taken == left:
            del self._starts[start]
        else:
            self._starts[start] = left - taken
        return taken

    def _unheld(self, now: int) -> None:
        if not self.held():
            self.progress_ns = max(self.progress_ns, now)  # silence restarts after a hold

    def totals(self) -> tuple[float, float, float]:
        """Seconds busy, idle and held so far."""
        with self._lock:
            self._accrue(time.monotonic_ns())
            return self.busy_ns / 1e9, self.idle_ns / 1e9, self.held_ns / 1e9

    def operations(self) -> list[tuple[str, int]]:
        with self._lock:
            return list(self.by_operation.items())

    def _accrue(self, now: int) -> None:
        if self.operations_running > 0 or self.states:
            self.held_ns += now - self._since
        elif self.active > 0:
            self.busy_ns += now - self._since
        else:
            self.idle_ns += now - self._since
        self._since = now


class MeterObservers:
    """The observable instruments of one meter, reporting for every engine telemetry on it.

    The SDK keeps the first observable instrument of a name on a meter and ignores a second
    one's callbacks, so instruments registered per ``Telemetry`` would leave all but the first
    emitter on a shared meter unreported. They are registered once per meter instead, and their
    callbacks sum over the meter's members (same attributes from two members add up).
    """

    def __init__(self, meter: Meter) -> None:
        self.members: weakref.WeakSet[ActivitySource] = weakref.WeakSet()
        meter.create_observable_up_down_counter(
            METRIC_ACTIVE,
            callbacks=[self._active],
            unit="{request}",
            description="Requests in flight in the engine now.",
        )
        meter.create_observable_counter(
            METRIC_ENGINE_BUSY_TIME,
            callbacks=[self._busy],
            unit="s",
            description="Time the engine had at least one request in flight.",
        )
        meter.create_observable_counter(
            METRIC_ENGINE_IDLE_TIME,
            callbacks=[self._idle],
            unit="s",
            description="Time the engine had no request in flight and was not held.",
        )
        meter.create_observable_counter(
            METRIC_ENGINE_HELD_TIME,
            callbacks=[self._held],
            unit="s",
            description=(
                "Time the engine was held by something other than generation: a weight sync, "
                "sleep or wake-up running, asleep, or generation paused (neither busy nor idle)."
            ),
        )

        meter.create_observable_gauge(
            METRIC_OLDEST_AGE,
            callbacks=[self._oldest],
            unit="s",
            description="Age of the engine's oldest request in flight (0 when none is).",
        )
        meter.create_observable_gauge(
            METRIC_ENGINE_SILENCE,
            callbacks=[self._silence],
            unit="s",
            description=(
                "Time the engine produced no output while requests were in flight "
                "(0 when none are, or while it is held by a weight sync, sleep or pause)."
            ),
        )
        meter.create_observable_gauge(
            METRIC_ENGINE_STALLED,
            callbacks=[self._stalled],
            description="1 while the engine's silence exceeds OTEL_ROLLOUT_STALL_TIMEOUT, else 0.",
        )

    def _per_engine(
        self, value: Callable[[EngineActivity], float]
    ) -> Iterator[tuple[dict[str, str], float]]:
        """(engine attributes, ``value(activity)``) for every engine of every member."""
        for t in list(self.members):
            for model, activity in t.activities():
                yield engine_attributes(t.provider, model), value(activity)

    @staticmethod
    def _fold(
        values: Iterator[tuple[dict[str, str], float]], combine: Callable[[float, float], float]
    ) -> Iterator[Observation]:
        """One observation per attribute set: two members with the same attributes combined
        (counters add up; gauges take the larger: the older, the stiller)."""
        folded: dict[frozenset[tuple[str, str]], tuple[dict[str, str], float]] = {}
        for attrs, value in values:
            key = frozenset(attrs.items())
            seen = folded.get(key)
            folded[key] = (attrs, value if seen is None else combine(seen[1], value))
        for attrs, value in folded.values():
            yield Observation(value, attrs)

    def _active(self, options: CallbackOptions) -> Iterator[Observation]:
        return self._fold(
            (
                (base_attributes(t.provider, model, op), n)
                for t in list(self.members)
                for model, activity in t.activities()
                for op, n in activity.operations()
            ),
            operator.add,
        )

    def _busy(self, options: CallbackOptions) -> Iterator[Observation]:
        return self._fold(self._per_engine(lambda a: a.totals()[0]), operator.add)

    def _idle(self, options: CallbackOptions) -> Iterator[Observation]:
        return self._fold(self._per_engine(lambda a: a.totals()[1]), operator.add)

    def _held(self, options: CallbackOptions) -> Iterator[Observation]:
        return self._fold(self._per_engine(lambda a: a.totals()[2]), operator.add)

    def _oldest(self, options: CallbackOptions) -> Iterator[Observation]:
        return self._fold(self._per_engine(EngineActivity.oldest_age_s), max)

    def _silence(self, options: CallbackOptions) -> Iterator[Observation]:
        return self._fold(self._per_engine(EngineActivity.silence_s), max)

    def _stalled(self, options: CallbackOptions) -> Iterator[Observation]:
        return self._fold(self._per_engine(lambda a: float(a.stalled)), max)


_OBSERVERS: dict[int, tuple[Meter, MeterObservers]] = {}
_OBSERVERS_LOCK = threading.Lock()


def meter_observers(meter: Meter) -> MeterObservers:
    """The meter's shared observable instruments, registered on its first member."""
    with _OBSERVERS_LOCK:
        entry = _OBSERVERS.get(id(meter))
        if entry is None or entry[0] is not meter:
            entry = (meter, MeterObservers(meter))  # the meter is kept: its id stays unique
            _OBSERVERS[id(meter)] = entry
        return entry[1]
