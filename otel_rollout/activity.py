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

import threading
import time
import weakref
from collections.abc import Iterator
from typing import Protocol

from opentelemetry.metrics import CallbackOptions, Meter, Observation

from otel_rollout.attributes import base_attributes, engine_attributes
from otel_rollout.semconv import (
    METRIC_ACTIVE,
    METRIC_ENGINE_BUSY_TIME,
    METRIC_ENGINE_HELD_TIME,
    METRIC_ENGINE_IDLE_TIME,
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
        "_since",
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
        self._lock = threading.Lock()

    def hold(self, delta: int) -> None:
        """An engine operation started (``+1``) or ended (``-1``)."""
        with self._lock:
            self._accrue(time.monotonic_ns())
            self.operations_running = max(0, self.operations_running + delta)

    def set_state(self, state: str, on: bool) -> None:
        """Enter or leave a lasting held state (``asleep`` after sleep, until wake-up)."""
        with self._lock:
            self._accrue(time.monotonic_ns())
            if on:
                self.states.add(state)
            else:
                self.states.discard(state)

    def change(self, delta: int, operation: str = "") -> None:
        if delta > 0:
            self.weights.generation_started()
        with self._lock:
            self._accrue(time.monotonic_ns())
            self.active = max(0, self.active + delta)
            ops = self.by_operation
            ops[operation] = max(0, ops.get(operation, 0) + delta)

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

    def _sum(self, values: Iterator[tuple[dict[str, str], float]]) -> Iterator[Observation]:
        totals: dict[frozenset[tuple[str, str]], tuple[dict[str, str], float]] = {}
        for attrs, value in values:
            key = frozenset(attrs.items())
            seen = totals.get(key)
            totals[key] = (attrs, value + (seen[1] if seen else 0))
        for attrs, value in totals.values():
            yield Observation(value, attrs)

    def _active(self, options: CallbackOptions) -> Iterator[Observation]:
        return self._sum(
            (base_attributes(t.provider, model, op), n)
            for t in list(self.members)
            for model, activity in t.activities()
            for op, n in activity.operations()
        )

    def _busy(self, options: CallbackOptions) -> Iterator[Observation]:
        return self._sum(
            (engine_attributes(t.provider, model), activity.totals()[0])
            for t in list(self.members)
            for model, activity in t.activities()
        )

    def _idle(self, options: CallbackOptions) -> Iterator[Observation]:
        return self._sum(
            (engine_attributes(t.provider, model), activity.totals()[1])
            for t in list(self.members)
            for model, activity in t.activities()
        )

    def _held(self, options: CallbackOptions) -> Iterator[Observation]:
        return self._sum(
            (engine_attributes(t.provider, model), activity.totals()[2])
            for t in list(self.members)
            for model, activity in t.activities()
        )


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
