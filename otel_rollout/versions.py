"""Which policy weights an engine generated with, over time: the weight version of each sample.

In fully-async RL the engine keeps generating while the trainer pushes new weights, so a step's
samples come from several policy versions; how far behind the trainer they are (staleness) is
what off-policy corrections and their users care about. An engine's weight version is

* counted from the weight updates the instrumentation sees (:mod:`otel_rollout.engine_ops`):
  version 0 until the first update, then one more per update — where a *burst* of weight-sync
  calls with no request started between them (verl sends its weights bucket by bucket, one RPC
  each) is one update;
* or named: by the engine call itself (vLLM's ``finish_weight_update(weight_version=…)``,
  SGLang's ``weight_version`` field) or by :func:`otel_rollout.set_weight_version`. Once a version
  was named, updates without a name no longer count up: the trainer's numbering wins.

A request's version is the one in effect when it arrived at the engine (its span's start), looked
up in a bounded history of changes, so it is exact for requests that were in flight during an
update too. Pure bookkeeping: no OpenTelemetry here.
"""

from __future__ import annotations

import bisect
import threading
from typing import ClassVar

__all__ = ["HISTORY", "WeightVersions", "as_int"]

HISTORY = 1024
"""Version changes remembered per engine; a request older than all of them gets the oldest."""

Version = int | str


def as_int(version: object) -> int | None:
    """A version usable for staleness (``7``, ``"7"``), else ``None`` (``"v7"``, ``None``)."""
    if isinstance(version, bool):
        return None
    if isinstance(version, int):
        return version
    if isinstance(version, str):
        try:
            return int(version)
        except ValueError:
            return None
    return None


class WeightVersions:
    """One engine's weight versions over time (wall-clock epoch ns), counted or named."""

    __slots__ = ("_times", "_versions", "_named", "_generated", "_lock")

    changed_anywhere: ClassVar[bool] = False
    """Whether any engine of this process ever changed weights: until then a hand-over asks no
    engine for its requests' versions (one class read per hand-over, not a pass over engines)."""

    def __init__(self) -> None:
        self._times: list[int] = []
        self._versions: list[Version] = []
        self._named = False
        self._generated = True
        self._lock = threading.Lock()

    @property
    def seen(self) -> bool:
        """Whether any version change was seen: before that, requests carry no version."""
        return bool(self._times)

    @property
    def current(self) -> Version:
        with self._lock:
            return self._versions[-1] if self._versions else 0

    def generation_started(self) -> None:
        """A request started: the next weight-sync call begins a new update."""
        self._generated = True

    def updated(self, at_ns: int, version: object = None) -> None:
        """A weight update finished at ``at_ns``; ``version`` if the engine call named one."""
        with self._lock:
            if version is not None:
                self._change(at_ns, _version(version))
                self._named = True
            elif self._named:
                return
            elif not self._generated and self._times:
                self._times[-1] = at_ns  # the same update, one more bucket: it ends later
            else:
                current = self._versions[-1] if self._versions else 0
                self._change(at_ns, (as_int(current) or 0) + 1)
            self._generated = False

    def name(self, at_ns: int, version: object) -> None:
        """The trainer says the engine now runs ``version`` (:func:`set_weight_version`)."""
        with self._lock:
            self._change(at_ns, _version(version))
            self._named = True
            self._generated = False

    def at(self, time_ns: int) -> Version | None:
        """The version in effect at ``time_ns``; ``None`` if no change was ever seen."""
        with self._lock:
            if not self._times:
                return None
            index = bisect.bisect_right(self._times, time_ns) - 1
            if index >= 0:
                return self._versions[index]
            # Before the first remembered change: the initial weights, or the oldest we know.
            return 0 if len(self._times) < HISTORY else self._versions[0]

    def _change(self, at_ns: int, version: Version) -> None:
        if self._times and at_ns < self._times[-1]:
            at_ns = self._times[-1]  # changes are in call order; a clock step back keeps it
        self._times.append(at_ns)
        self._versions.append(version)
        WeightVersions.changed_anywhere = True
        if len(self._times) > HISTORY:
            del self._times[0], self._versions[0]


def _version(value: object) -> Version:
    number = as_int(value)
    return number if number is not None else str(value)
