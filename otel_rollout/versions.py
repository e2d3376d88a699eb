"""Which policy weights an engine generated with, over time: the weight version of each sample.

In fully-async RL the engine keeps generating while the trainer pushes new weights, so a step's
samples come from several policy versions; how far behind the trainer they are (staleness) is
what off-policy corrections and their users care about. An engine's weight version is

* counted from the weight updates the instrumentation sees (:mod:`otel_rollout.engine_ops`):
  version 0 until the first update, then one more per update — where a *burst* of weight-sync
  calls with no request started between them (verl sends its weights bucket by bucket, one RPC
  each) is one update;
* or named: by the engine call itself (vLLM's ``update_weight_version(…)`` and
  ``finish_weight_update(weight_version=…)``, ``LLMEngine.set_weight_version``, SGLang's
  ``weight_version`` field) or by :func:`otel_rollout.set_weight_version`. Once a version was
  named, updates without a name no longer count up: the trainer's numbering wins.

Where the engine itself says which version generated a request's tokens (vLLM 0.32's
``CompletionOutput.weight_versions``, SGLang 0.5.23's ``meta_info["weight_versions"]``), that is
the request's version (source ``engine``): exact even when a sync lands mid-request. Otherwise a
request's version is the one in effect when it arrived at the engine (its span's start), looked
up here in a bounded history of changes, with the source of that change (``named`` or
``counted``). Pure bookkeeping: no OpenTelemetry here.
"""

from __future__ import annotations

import bisect
import threading
from collections.abc import Iterable
from typing import ClassVar

__all__ = [
    "COUNTED",
    "ENGINE",
    "HISTORY",
    "NAMED",
    "UNNAMED",
    "WeightVersions",
    "as_int",
    "as_version",
    "token_versions",
]

ENGINE = "engine"
"""``rollout.weight.version_source``: the engine's own per-token versions of the request."""
NAMED = "named"
"""A name an engine call or the trainer gave, in effect when the request arrived."""
COUNTED = "counted"
"""Our count of the weight updates seen, where nothing named a version."""
UNNAMED = "default"
"""vLLM's and SGLang's label for weights nothing has named (vLLM's ``EngineCore``, SGLang's
``--weight-version`` default): a sync without a name keeps it."""

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

    __slots__ = ("_times", "_versions", "_sources", "_named", "_generated", "_lock")

    changed_anywhere: ClassVar[bool] = False
    """Whether any engine of this process ever changed weights: until then a hand-over asks no
    engine for its requests' versions (one class read per hand-over, not a pass over engines)."""

    def __init__(self) -> None:
        self._times: list[int] = []
        self._versions: list[Version] = []
        self._sources: list[str] = []
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
                self._change(at_ns, as_version(version), NAMED)
                self._named = True
            elif self._named:
                return
            elif not self._generated and self._times:
                self._times[-1] = at_ns  # the same update, one more bucket: it ends later
            else:
                current = self._versions[-1] if self._versions else 0
                self._change(at_ns, (as_int(current) or 0) + 1, COUNTED)
            self._generated = False

    def name(self, at_ns: int, version: object) -> None:
        """The trainer says the engine now runs ``version`` (:func:`set_weight_version`)."""
        with self._lock:
            self._change(at_ns, as_version(version), NAMED)
            self._named = True
            self._generated = False

    def at(self, time_ns: int) -> Version | None:
        """The version in effect at ``time_ns``; ``None`` if no change was ever seen."""
        found = self.lookup(time_ns)
        return None if found is None else found[0]

    def lookup(self, time_ns: int) -> tuple[Version, str] | None:
        """The version in effect at ``time_ns`` and whether it was named or counted; ``None``
        if no change was ever seen."""
        with self._lock:
            if not self._times:
                return None
            index = bisect.bisect_right(self._times, time_ns) - 1
            if index >= 0:
                return self._versions[index], self._sources[index]
            # Before the first remembered change: the initial weights (nothing named them: 0,
            # counted), or the oldest we know.
            if len(self._times) < HISTORY:
                return 0, COUNTED
            return self._versions[0], self._sources[0]

    def _change(self, at_ns: int, version: Version, source: str) -> None:
        last = (self._sources[-1], self._versions[-1]) if self._sources else None
        if source == NAMED and last == (NAMED, version):
            return  # named again (vLLM's finish_weight_update names through update_weight_version)
        if self._times and at_ns < self._times[-1]:
            at_ns = self._times[-1]  # changes are in call order; a clock step back keeps it
        self._times.append(at_ns)
        self._versions.append(version)
        self._sources.append(source)
        WeightVersions.changed_anywhere = True
        if len(self._times) > HISTORY:
            del self._times[0], self._versions[0], self._sources[0]


def token_versions(spans: Iterable[tuple[str, int, int]]) -> tuple[tuple[str, int], ...]:
    """An engine's own version spans over a request's output tokens — (version, start, end),
    token indexes, over all its samples — as (version, tokens) in the order first seen.
    Empty where there are none, or where every span carries the label of weights nothing named
    (:data:`UNNAMED`): weights synced without a name keep that label, so only our count of
    updates can tell them apart."""
    merged: dict[str, int] = {}
    for version, start, end in spans:
        merged[version] = merged.get(version, 0) + max(0, end - start)
    if not merged or merged.keys() == {UNNAMED}:
        return ()
    return tuple(merged.items())


def as_version(value: object) -> Version:
    """A version as this package keeps it: a number where the name is one (``"7"`` → 7), so
    a version named by a call and the same one reported by the engine compare equal."""
    number = as_int(value)
    return number if number is not None else str(value)
