"""The stall watch: tell a stuck rollout from a slow one while it is stuck, not after.

A slow step still produces tokens: its stragglers decode, requests finish. A stuck one produces
nothing: a hung engine core, a deadlocked collective, a request the scheduler never picks up.
Each engine's silence (:meth:`otel_rollout.activity.EngineActivity.silence_s`: no output while
requests are in flight, time held by a weight sync or pause excluded) is exported as the gauges
``rollout.engine.silence`` / ``rollout.engine.stalled``; this module adds the terminal's view: a
daemon thread that looks once a second (a dict walk, no engine call) and logs one warning when an
engine's silence passes ``OTEL_ROLLOUT_STALL_TIMEOUT`` (with the open step's progress and the
oldest request's age) and one line when output resumes. Nothing here runs on generate's path.

:func:`check` is the decision, a pure function of the engines' state and a clock, so it is tested
without a thread; :class:`StallWatch` only calls it periodically.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from otel_rollout.activity import EngineActivity

_logger = logging.getLogger(__name__)

TICK_S = 1.0
"""How often the watch looks (at most; a shorter timeout makes it look 4× per timeout)."""


@dataclass(frozen=True)
class StallEvent:
    """An engine became stalled (``resumed`` False) or produced output again (True)."""

    provider: str
    model: str
    resumed: bool
    silence_s: float
    in_flight: int
    oldest_s: float


Engines = Callable[[], Iterable[tuple[str, str, EngineActivity]]]
"""(provider, model, activity) of each engine this process observes."""
Progress = Callable[[], Iterable[tuple[int | None, int, int]]]
"""(step, done, started) of each step open in this process."""


def check(
    engines: Iterable[tuple[str, str, EngineActivity]],
    timeout_s: float,
    stalled: dict[tuple[str, str], int],
    now_ns: int | None = None,
) -> list[StallEvent]:
    """Stall starts and ends since the last check. ``stalled`` maps each engine stalled at the
    last check to when its silence began, and is updated in place; a resumed event's
    ``silence_s`` is how long the stall lasted."""
    now = time.monotonic_ns() if now_ns is None else now_ns
    events = []
    for provider, model, activity in engines:
        key = (provider, model)
        silence = activity.silence_s(now)
        began = stalled.get(key)
        if (silence > timeout_s) == (began is not None):
            continue  # no change: still fine, or still stalled
        if began is None:
            stalled[key] = now - int(silence * 1e9)
            resumed, seconds = False, silence
        else:
            del stalled[key]
            resumed, seconds = True, (now - began) / 1e9 - silence
        activity.stalled = not resumed
        events.append(
            StallEvent(
                provider, model, resumed, seconds, activity.active, activity.oldest_age_s(now)
            )
        )
    return events


def describe(
    event: StallEvent, steps: Iterable[tuple[int | None, int, int]], timeout_s: float
) -> str:
    """The log line of one event: which engine, for how long, and how far its step got."""
    engine = f"{event.provider} engine {event.model!r}"
    if event.resumed:
        return (
            f"otel_rollout: {engine} produces output again after {event.silence_s:.1f} s "
            f"without ({event.in_flight} request(s) in flight)"
        )
    progress = "; ".join(
        f"step {'?' if step is None else step}: {done} of {started} requests done"
        for step, done, started in steps
    )
    return (
        f"otel_rollout: {engine} stalled: no output for {event.silence_s:.1f} s with "
        f"{event.in_flight} request(s) in flight, the oldest {event.oldest_s:.1f} s old"
        + (f"; {progress}" if progress else "")
        + f" (OTEL_ROLLOUT_STALL_TIMEOUT={timeout_s:g})"
    )


class StallWatch:
    """The daemon thread that calls :func:`check` and logs its events."""

    def __init__(self, timeout_s: float, engines: Engines, steps: Progress) -> None:
        self.timeout_s = timeout_s
        self._engines = engines
        self._steps = steps
        self._stalled: dict[tuple[str, str], int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="otel_rollout-stalls", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2 * TICK_S)
        for provider, model, activity in self._engines():
            if (provider, model) in self._stalled:
                activity.stalled = False  # no watch, no stalled gauge
        self._stalled.clear()

    def _run(self) -> None:
        while not self._stop.wait(min(TICK_S, self.timeout_s / 4)):
            try:
                self.tick()
            except Exception:  # the watch must never take the process down
                _logger.debug("otel_rollout: stall watch failed", exc_info=True)

    def tick(self) -> list[StallEvent]:
        events = check(self._engines(), self.timeout_s, self._stalled)
        for event in events:
            line = describe(event, list(self._steps()) if not event.resumed else (), self.timeout_s)
            _logger.log(logging.INFO if event.resumed else logging.WARNING, line)
        return events


_WATCH: list[StallWatch] = []
_WATCH_LOCK = threading.Lock()
# A forked child has no watch thread: it starts its own if it instruments an engine.
os.register_at_fork(after_in_child=_WATCH.clear)


def watch(timeout_s: float, engines: Engines, steps: Progress) -> StallWatch | None:
    """Start the process's stall watch once; a later call (an instrumentor set up again, with
    the configuration of then) sets its timeout, and ``timeout_s`` 0 stops it."""
    with _WATCH_LOCK:
        if _WATCH and timeout_s <= 0:
            _WATCH.pop().stop()
        if timeout_s <= 0:
            return None
        if not _WATCH:
            _WATCH.append(StallWatch(timeout_s, engines, steps))
        _WATCH[0].timeout_s = timeout_s
        return _WATCH[0]
